//! A tiny classic-BPF assembler for seccomp filters: instructions with symbolic forward jumps,
//! resolved into the kernel's 8-bit offsets (a jump too far is an error, never a wrong jump).

/// One instruction: the kernel's `struct sock_filter`.
pub(crate) type Insn = libc::sock_filter;

/// Where a conditional jump goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum To {
    /// The next instruction.
    Next,
    /// A label, bound later with [`Assembler::bind`].
    Label(Label),
}

/// A position in the program, bound once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Label(usize);

/// Why a program could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AsmError {
    /// A label was used but never bound.
    #[error("label {0} is never bound")]
    Unbound(usize),
    /// A jump goes backwards or more than 255 instructions forward.
    #[error("a jump from instruction {from} to {to} does not fit classic BPF")]
    TooFar {
        /// The jumping instruction.
        from: usize,
        /// Its target.
        to: usize,
    },
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;

/// The comparison of a conditional jump (against a constant).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cmp {
    /// `A == k`
    Eq,
    /// `A > k` (unsigned)
    Gt,
    /// `A >= k` (unsigned)
    Ge,
    /// `A & k != 0`
    Set,
}

impl Cmp {
    fn code(self) -> u16 {
        let op = match self {
            Cmp::Eq => libc::BPF_JEQ,
            Cmp::Gt => libc::BPF_JGT,
            Cmp::Ge => libc::BPF_JGE,
            Cmp::Set => libc::BPF_JSET,
        };
        (libc::BPF_JMP | op | libc::BPF_K) as u16
    }
}

#[derive(Debug, Default)]
pub(crate) struct Assembler {
    /// Each instruction with its jumps: `jt`, `jf`, or for `JA` its 32-bit target.
    code: Vec<(Insn, To, To)>,
    labels: Vec<Option<usize>>,
}

impl Assembler {
    /// A new, unbound label.
    pub(crate) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `label` to the next instruction.
    pub(crate) fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.code.len());
    }

    fn push(&mut self, code: u16, k: u32, jt: To, jf: To) {
        let insn = Insn {
            code,
            jt: 0,
            jf: 0,
            k,
        };
        self.code.push((insn, jt, jf));
    }

    /// `A = seccomp_data[offset]` (a 32-bit word).
    pub(crate) fn load(&mut self, offset: u32) {
        self.push(LD_W_ABS, offset, To::Next, To::Next);
    }

    /// `if A <cmp> k goto jt else goto jf`.
    pub(crate) fn jump(&mut self, cmp: Cmp, k: u32, jt: To, jf: To) {
        self.push(cmp.code(), k, jt, jf);
    }

    /// `return k`.
    pub(crate) fn ret(&mut self, k: u32) {
        self.push(RET_K, k, To::Next, To::Next);
    }

    /// `goto label`, as far forward as needed (a 32-bit offset).
    pub(crate) fn goto(&mut self, label: Label) {
        self.push(JA, 0, To::Label(label), To::Next);
    }

    /// `A &= k`.
    pub(crate) fn and(&mut self, k: u32) {
        self.push(AND_K, k, To::Next, To::Next);
    }

    /// How many instructions so far.
    pub(crate) fn len(&self) -> usize {
        self.code.len()
    }

    /// The program, with every jump resolved.
    pub(crate) fn finish(self) -> Result<Vec<Insn>, AsmError> {
        let offset = |from: usize, to: To| -> Result<usize, AsmError> {
            let target = match to {
                To::Next => return Ok(0),
                To::Label(Label(id)) => self.labels[id].ok_or(AsmError::Unbound(id))?,
            };
            target
                .checked_sub(from + 1)
                .ok_or(AsmError::TooFar { from, to: target })
        };
        let short = |from: usize, to: To| -> Result<u8, AsmError> {
            let far = offset(from, to)?;
            u8::try_from(far).map_err(|_| AsmError::TooFar {
                from,
                to: from + 1 + far,
            })
        };
        self.code
            .iter()
            .enumerate()
            .map(|(at, (insn, jt, jf))| {
                if insn.code == JA {
                    let k = u32::try_from(offset(at, *jt)?).map_err(|_| AsmError::TooFar {
                        from: at,
                        to: usize::MAX,
                    })?;
                    return Ok(Insn { k, ..*insn });
                }
                Ok(Insn {
                    jt: short(at, *jt)?,
                    jf: short(at, *jf)?,
                    ..*insn
                })
            })
            .collect()
    }
}

/// Runs `program` over a `seccomp_data` (for tests): the value it returns.
#[cfg(test)]
pub(crate) fn run(program: &[Insn], data: &[u8]) -> u32 {
    let mut pc = 0usize;
    let mut acc = 0u32;
    loop {
        let insn = program[pc];
        match insn.code {
            LD_W_ABS => {
                let at = insn.k as usize;
                let word: [u8; 4] = data[at..at + 4].try_into().expect("in bounds");
                acc = u32::from_ne_bytes(word);
            }
            RET_K => return insn.k,
            JA => pc += insn.k as usize,
            AND_K => acc &= insn.k,
            code => {
                let k = insn.k;
                let taken = match u32::from(code) & 0xf0 {
                    libc::BPF_JEQ => acc == k,
                    libc::BPF_JGT => acc > k,
                    libc::BPF_JGE => acc >= k,
                    libc::BPF_JSET => acc & k != 0,
                    other => panic!("unexpected jump {other:#x}"),
                };
                pc += usize::from(if taken { insn.jt } else { insn.jf });
            }
        }
        pc += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_resolve_forward_and_refuse_the_unrepresentable() {
        let mut asm = Assembler::default();
        let yes = asm.label();
        asm.load(0);
        asm.jump(Cmp::Eq, 7, To::Label(yes), To::Next);
        asm.ret(1);
        asm.bind(yes);
        asm.ret(2);
        let program = asm.finish().expect("assembles");
        let data = |nr: u32| {
            let mut d = [0u8; 64];
            d[..4].copy_from_slice(&nr.to_ne_bytes());
            d
        };
        assert_eq!(run(&program, &data(7)), 2);
        assert_eq!(run(&program, &data(8)), 1);

        let mut asm = Assembler::default();
        let never = asm.label();
        asm.jump(Cmp::Eq, 0, To::Label(never), To::Next);
        assert_eq!(asm.finish().expect_err("unbound"), AsmError::Unbound(0));

        let mut asm = Assembler::default();
        let far = asm.label();
        asm.jump(Cmp::Eq, 0, To::Label(far), To::Next);
        for _ in 0..300 {
            asm.ret(0);
        }
        asm.bind(far);
        asm.ret(1);
        assert!(matches!(
            asm.finish(),
            Err(AsmError::TooFar { from: 0, .. })
        ));

        // A goto reaches past what a conditional jump can.
        let mut asm = Assembler::default();
        let (far, near) = (asm.label(), asm.label());
        asm.load(0);
        asm.and(0xf0);
        asm.jump(Cmp::Eq, 0x70, To::Next, To::Label(near));
        asm.goto(far);
        asm.bind(near);
        asm.ret(2);
        for _ in 0..300 {
            asm.ret(0);
        }
        asm.bind(far);
        asm.ret(1);
        let program = asm.finish().expect("assembles");
        assert_eq!(program[3].k, 301);
        assert_eq!(run(&program, &data(0x75)), 1);
        assert_eq!(run(&program, &data(0x85)), 2);
    }
}
