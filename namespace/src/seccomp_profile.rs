//! A container's own seccomp profile (OCI's `linux.seccomp`, a Kubernetes `Localhost` or
//! `RuntimeDefault` profile), compiled to a classic-BPF filter that is stacked on the
//! sandbox's own ([`crate::seccomp`]): the kernel runs both and takes the stricter verdict, so
//! a profile can only refuse more, never allow what the sandbox's filter refuses.
//!
//! The program: calls of another architecture and of the x32 ABI are left to the sandbox's
//! filter (it kills or refuses them); numbers whose first rule checks no argument return its
//! action at once (consecutive ones with the same action as one range), each other number
//! the profile names jumps to its own block, where its rules are tried in the profile's order
//! (a rule's argument checks all hold, or the next rule is tried), and anything else gets the
//! default action. Names x86_64 does not
//! have are skipped, as runc skips the names libseccomp does not know: profiles list calls of
//! every architecture and kernel generation. A rule naming one argument more than once holds
//! when any of those checks does (runc's reading of such a rule).
//!
//! Compiled once by the daemon, which refuses a profile it cannot compile with a reason; the
//! container installs the program as it is.

use std::collections::BTreeMap;

use crate::bpf::{Assembler, Cmp, Insn, Label, To};

/// What a profile does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `SCMP_ACT_ALLOW`.
    Allow,
    /// `SCMP_ACT_ERRNO`: fails with this errno.
    Errno(u16),
    /// `SCMP_ACT_KILL`, `SCMP_ACT_KILL_THREAD`.
    KillThread,
    /// `SCMP_ACT_KILL_PROCESS`.
    KillProcess,
    /// `SCMP_ACT_TRAP`: `SIGSYS`.
    Trap,
    /// `SCMP_ACT_TRACE`: a tracer is told (without one the call fails with `ENOSYS`).
    Trace(u16),
}

pub use contract::container_security::SECCOMP_MAX_ERRNO as MAX_ERRNO;

impl Action {
    /// The action OCI names `name` (`SCMP_ACT_ERRNO`, …), with `errno_ret` for the two that
    /// take one (default `EPERM` for `SCMP_ACT_ERRNO`, 0 for `SCMP_ACT_TRACE`).
    pub fn parse(name: &str, errno_ret: Option<u32>) -> Result<Action, ProfileError> {
        let errno = |default: u32| -> Result<u16, ProfileError> {
            let errno = errno_ret.unwrap_or(default);
            match u16::try_from(errno) {
                Ok(errno) if u32::from(errno) <= MAX_ERRNO => Ok(errno),
                _ => Err(ProfileError::Errno(errno)),
            }
        };
        let takes_errno = matches!(name, "SCMP_ACT_ERRNO" | "SCMP_ACT_TRACE");
        if errno_ret.is_some() && !takes_errno {
            return Err(ProfileError::ErrnoWithout(name.to_string()));
        }
        Ok(match name {
            "SCMP_ACT_ALLOW" => Action::Allow,
            "SCMP_ACT_ERRNO" => Action::Errno(errno(libc::EPERM as u32)?),
            "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => Action::KillThread,
            "SCMP_ACT_KILL_PROCESS" => Action::KillProcess,
            "SCMP_ACT_TRAP" => Action::Trap,
            "SCMP_ACT_LOG" => return Err(ProfileError::Logs),
            "SCMP_ACT_TRACE" => Action::Trace(errno(0)?),
            other => return Err(ProfileError::Action(other.to_string())),
        })
    }

    /// The filter's return value.
    fn ret(self) -> u32 {
        match self {
            Action::Allow => libc::SECCOMP_RET_ALLOW,
            Action::Errno(errno) => libc::SECCOMP_RET_ERRNO | u32::from(errno),
            Action::KillThread => libc::SECCOMP_RET_KILL_THREAD,
            Action::KillProcess => libc::SECCOMP_RET_KILL_PROCESS,
            Action::Trap => libc::SECCOMP_RET_TRAP,
            Action::Trace(data) => libc::SECCOMP_RET_TRACE | u32::from(data),
        }
    }
}

/// How an argument is compared (OCI's `op`), as 64-bit unsigned values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `SCMP_CMP_NE`
    NotEqual,
    /// `SCMP_CMP_LT`
    Less,
    /// `SCMP_CMP_LE`
    LessOrEqual,
    /// `SCMP_CMP_EQ`
    Equal,
    /// `SCMP_CMP_GE`
    GreaterOrEqual,
    /// `SCMP_CMP_GT`
    Greater,
    /// `SCMP_CMP_MASKED_EQ`: `arg & value == value_two`.
    MaskedEqual,
}

impl Op {
    /// The comparison OCI names `name`.
    pub fn parse(name: &str) -> Result<Op, ProfileError> {
        Ok(match name {
            "SCMP_CMP_NE" => Op::NotEqual,
            "SCMP_CMP_LT" => Op::Less,
            "SCMP_CMP_LE" => Op::LessOrEqual,
            "SCMP_CMP_EQ" => Op::Equal,
            "SCMP_CMP_GE" => Op::GreaterOrEqual,
            "SCMP_CMP_GT" => Op::Greater,
            "SCMP_CMP_MASKED_EQ" => Op::MaskedEqual,
            other => return Err(ProfileError::Op(other.to_string())),
        })
    }
}

/// One argument check of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgCheck {
    /// Which argument, 0–5.
    pub index: u8,
    /// The value compared with (the mask, for [`Op::MaskedEqual`]).
    pub value: u64,
    /// The value the masked argument must equal ([`Op::MaskedEqual`] only).
    pub value_two: u64,
    /// The comparison.
    pub op: Op,
}

/// One rule: the calls it names get `action` when every check holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// System call names.
    pub names: Vec<String>,
    /// What they get.
    pub action: Action,
    /// Argument checks, all of which must hold.
    pub args: Vec<ArgCheck>,
}

/// A whole profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// What a call no rule matches gets.
    pub default_action: Action,
    /// The rules, in order.
    pub rules: Vec<Rule>,
}

pub use contract::container_security::{
    MAX_FILTER_INSNS as MAX_INSNS, SECCOMP_MAX_ARGS as MAX_ARGS, SECCOMP_MAX_NAMES as MAX_NAMES,
    SECCOMP_MAX_RULES as MAX_RULES,
};

/// Why a profile cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// An action crucible does not apply.
    #[error(
        "action {0:?} is not one of SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL, \
         SCMP_ACT_KILL_THREAD, SCMP_ACT_KILL_PROCESS, SCMP_ACT_TRAP, SCMP_ACT_TRACE \
         (SCMP_ACT_NOTIFY needs a listener, which crucible does not run)"
    )]
    Action(String),
    /// `SCMP_ACT_LOG`, which would have the tenant write the host's kernel log.
    #[error(
        "SCMP_ACT_LOG is refused: it would write a line to the host's kernel log for every \
         call a tenant's process makes"
    )]
    Logs,
    /// An errno out of range.
    #[error("errno {0} is more than {MAX_ERRNO}")]
    Errno(u32),
    /// An errno for an action that takes none.
    #[error("an errno_ret for {0}, which takes none (only SCMP_ACT_ERRNO and SCMP_ACT_TRACE do)")]
    ErrnoWithout(String),
    /// An unknown comparison.
    #[error(
        "op {0:?} is not one of SCMP_CMP_NE, SCMP_CMP_LT, SCMP_CMP_LE, SCMP_CMP_EQ, \
         SCMP_CMP_GE, SCMP_CMP_GT, SCMP_CMP_MASKED_EQ"
    )]
    Op(String),
    /// An argument index past the sixth.
    #[error("argument index {0} is not 0–5")]
    Index(u8),
    /// Too much of something.
    #[error("{what}: {count}, more than {limit}")]
    TooMany {
        /// What there is too much of.
        what: &'static str,
        /// How many.
        count: usize,
        /// The most allowed.
        limit: usize,
    },
    /// The program did not assemble (a bug, never the profile's fault).
    #[error("the program does not assemble: {0}")]
    Assembly(String),
}

const ARCH_X86_64: u32 = 0xC000_003E;
const X32_BIT: u32 = 0x4000_0000;
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// The offset of the low (`high == false`) or high 32 bits of argument `index`.
fn arg_word(index: u8, high: bool) -> u32 {
    16 + 8 * u32::from(index) + if high { 4 } else { 0 }
}

/// Splits a 64-bit value into its high and low 32 bits.
fn halves(value: u64) -> (u32, u32) {
    ((value >> 32) as u32, value as u32)
}

/// Emits `check`: falls through to the next instruction when it holds, jumps to `fail` when
/// not.
fn emit_check(asm: &mut Assembler, check: &ArgCheck, fail: Label) {
    let pass = asm.label();
    let (hi, lo) = halves(check.value);
    let (load_hi, load_lo) = (arg_word(check.index, true), arg_word(check.index, false));
    let (f, p) = (To::Label(fail), To::Label(pass));
    match check.op {
        Op::Equal => {
            asm.load(load_hi);
            asm.jump(Cmp::Eq, hi, To::Next, f);
            asm.load(load_lo);
            asm.jump(Cmp::Eq, lo, p, f);
        }
        Op::NotEqual => {
            asm.load(load_hi);
            asm.jump(Cmp::Eq, hi, To::Next, p);
            asm.load(load_lo);
            asm.jump(Cmp::Eq, lo, f, p);
        }
        Op::MaskedEqual => {
            let (want_hi, want_lo) = halves(check.value_two);
            asm.load(load_hi);
            asm.and(hi);
            asm.jump(Cmp::Eq, want_hi, To::Next, f);
            asm.load(load_lo);
            asm.and(lo);
            asm.jump(Cmp::Eq, want_lo, p, f);
        }
        Op::Greater | Op::GreaterOrEqual => {
            // The high words decide unless equal; then the low ones do.
            asm.load(load_hi);
            asm.jump(Cmp::Gt, hi, p, To::Next);
            asm.jump(Cmp::Eq, hi, To::Next, f);
            asm.load(load_lo);
            let cmp = match check.op {
                Op::Greater => Cmp::Gt,
                _ => Cmp::Ge,
            };
            asm.jump(cmp, lo, p, f);
        }
        Op::Less | Op::LessOrEqual => {
            asm.load(load_hi);
            asm.jump(Cmp::Ge, hi, To::Next, p);
            asm.jump(Cmp::Gt, hi, f, To::Next);
            asm.load(load_lo);
            match check.op {
                Op::Less => asm.jump(Cmp::Ge, lo, f, p),
                _ => asm.jump(Cmp::Gt, lo, f, p),
            }
        }
    }
    asm.bind(pass);
}

/// A rule as the program tries it: its checks (all must hold) and its action.
struct Alternative<'a> {
    checks: Vec<&'a ArgCheck>,
    action: Action,
}

/// `rule` as alternatives: itself, or one per check when it checks an argument twice.
fn alternatives(rule: &Rule) -> Vec<Alternative<'_>> {
    let mut indexes: Vec<u8> = rule.args.iter().map(|a| a.index).collect();
    indexes.sort_unstable();
    let repeats = indexes.windows(2).any(|w| w[0] == w[1]);
    if repeats {
        rule.args
            .iter()
            .map(|check| Alternative {
                checks: vec![check],
                action: rule.action,
            })
            .collect()
    } else {
        vec![Alternative {
            checks: rule.args.iter().collect(),
            action: rule.action,
        }]
    }
}

/// Checks `profile`'s bounds and arguments.
fn check(profile: &Profile) -> Result<(), ProfileError> {
    let too_many = |what, count, limit| match count > limit {
        true => Err(ProfileError::TooMany { what, count, limit }),
        false => Ok(()),
    };
    too_many("rules", profile.rules.len(), MAX_RULES)?;
    let names = profile.rules.iter().map(|r| r.names.len()).sum();
    too_many("names over all rules", names, MAX_NAMES)?;
    for rule in &profile.rules {
        too_many("argument checks in a rule", rule.args.len(), MAX_ARGS)?;
        if let Some(bad) = rule.args.iter().find(|a| a.index > 5) {
            return Err(ProfileError::Index(bad.index));
        }
    }
    Ok(())
}

/// Compiles `profile`, each instruction packed as [`pack`] does.
pub fn compile(profile: &Profile) -> Result<Vec<u64>, ProfileError> {
    Ok(assemble(profile)?.iter().map(pack).collect())
}

fn assemble(profile: &Profile) -> Result<Vec<Insn>, ProfileError> {
    check(profile)?;
    // Each known number's alternatives, in the profile's order.
    let mut by_number: BTreeMap<u32, Vec<Alternative<'_>>> = BTreeMap::new();
    for rule in &profile.rules {
        let mut numbers: Vec<u32> = rule
            .names
            .iter()
            .filter_map(|name| crate::syscall_table::number(name))
            .collect();
        numbers.dedup();
        for nr in numbers {
            by_number.entry(nr).or_default().extend(alternatives(rule));
        }
    }
    let mut asm = Assembler::default();
    // Another architecture's or the x32 ABI's: the sandbox's own filter decides.
    let (native, x86_64) = (asm.label(), asm.label());
    asm.load(DATA_ARCH);
    asm.jump(Cmp::Eq, ARCH_X86_64, To::Label(x86_64), To::Next);
    asm.ret(libc::SECCOMP_RET_ALLOW);
    asm.bind(x86_64);
    asm.load(DATA_NR);
    asm.jump(Cmp::Set, X32_BIT, To::Next, To::Label(native));
    asm.ret(libc::SECCOMP_RET_ALLOW);
    asm.bind(native);
    // A number whose first alternative checks nothing has that action: runs of consecutive
    // such numbers with the same action are one range, returned from in place. The others
    // jump to a block of their own.
    let mut ranges: Vec<(u32, u32, Action)> = Vec::new();
    let mut blocks: Vec<(u32, Label)> = Vec::new();
    for (nr, alternatives) in &by_number {
        match alternatives.first() {
            Some(first) if first.checks.is_empty() => match ranges.last_mut() {
                Some((_, end, action)) if *end + 1 == *nr && *action == first.action => {
                    *end = *nr;
                }
                _ => ranges.push((*nr, *nr, first.action)),
            },
            _ => blocks.push((*nr, asm.label())),
        }
    }
    for (start, end, action) in &ranges {
        let skip = asm.label();
        if start == end {
            asm.jump(Cmp::Eq, *start, To::Next, To::Label(skip));
        } else {
            asm.jump(Cmp::Ge, *start, To::Next, To::Label(skip));
            asm.jump(Cmp::Gt, *end, To::Label(skip), To::Next);
        }
        asm.ret(action.ret());
        asm.bind(skip);
    }
    for (nr, block) in &blocks {
        let skip = asm.label();
        asm.jump(Cmp::Eq, *nr, To::Next, To::Label(skip));
        asm.goto(*block);
        asm.bind(skip);
    }
    asm.ret(profile.default_action.ret());
    for (nr, block) in &blocks {
        asm.bind(*block);
        for alternative in by_number.get(nr).into_iter().flatten() {
            let next = asm.label();
            for check in &alternative.checks {
                emit_check(&mut asm, check, next);
            }
            asm.ret(alternative.action.ret());
            asm.bind(next);
        }
        asm.ret(profile.default_action.ret());
        if asm.len() > MAX_INSNS {
            break;
        }
    }
    if asm.len() > MAX_INSNS {
        return Err(ProfileError::TooMany {
            what: "instructions compiled",
            count: asm.len(),
            limit: MAX_INSNS,
        });
    }
    asm.finish()
        .map_err(|e| ProfileError::Assembly(e.to_string()))
}

/// One instruction as a 64-bit word: `code << 48 | jt << 40 | jf << 32 | k`.
pub fn pack(insn: &Insn) -> u64 {
    u64::from(insn.code) << 48
        | u64::from(insn.jt) << 40
        | u64::from(insn.jf) << 32
        | u64::from(insn.k)
}

/// The instruction [`pack`] made `word` from.
pub(crate) fn unpack(word: u64) -> Insn {
    Insn {
        code: (word >> 48) as u16,
        jt: (word >> 40) as u8,
        jf: (word >> 32) as u8,
        k: word as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(program: &[Insn], nr: u32, args: [u64; 6]) -> u32 {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_ne_bytes());
        d[4..8].copy_from_slice(&ARCH_X86_64.to_ne_bytes());
        for (i, arg) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
        }
        crate::bpf::run(program, &d)
    }

    fn rule(names: &[&str], action: Action, args: Vec<ArgCheck>) -> Rule {
        Rule {
            names: names.iter().map(|n| n.to_string()).collect(),
            action,
            args,
        }
    }

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    fn a_deny_list_refuses_what_it_names_and_nothing_else() {
        // critest's profile that denies chmod.
        let profile = Profile {
            default_action: Action::Allow,
            rules: vec![rule(
                &["chmod", "fchmodat", "no_such_call"],
                Action::parse("SCMP_ACT_ERRNO", None).expect("errno"),
                vec![],
            )],
        };
        let program = assemble(&profile).expect("compiles");
        for nr in [libc::SYS_chmod, libc::SYS_fchmodat] {
            assert_eq!(verdict(&program, nr as u32, [0; 6]), EPERM, "{nr}");
        }
        for nr in [libc::SYS_read, libc::SYS_fchmod, libc::SYS_fchmodat2, 1000] {
            assert_eq!(verdict(&program, nr as u32, [0; 6]), ALLOW, "{nr}");
        }
        // The x32 ABI's and other architectures' calls are the sandbox filter's to judge.
        assert_eq!(verdict(&program, X32_BIT | 90, [0; 6]), ALLOW);
    }

    #[test]
    fn an_allow_list_with_arguments_compares_all_64_bits() {
        let check = |op, value, value_two| ArgCheck {
            index: 1,
            value,
            value_two,
            op,
        };
        let big = 0x0000_0001_0000_0005u64;
        for (op, value, value_two, arg, holds) in [
            (Op::Equal, big, 0, big, true),
            (Op::Equal, big, 0, 5, false),
            (Op::NotEqual, big, 0, 5, true),
            (Op::NotEqual, big, 0, big, false),
            (Op::Greater, big, 0, big + 1, true),
            (Op::Greater, big, 0, big, false),
            (Op::Greater, big, 0, 6, false),
            (Op::Greater, 5, 0, 1 << 32, true),
            (Op::GreaterOrEqual, big, 0, big, true),
            (Op::GreaterOrEqual, big, 0, big - 1, false),
            (Op::Less, big, 0, big - 1, true),
            (Op::Less, big, 0, big, false),
            (Op::Less, big, 0, 2 << 32, false),
            (Op::Less, 1 << 32, 0, 0xffff_ffff, true),
            (Op::LessOrEqual, big, 0, big, true),
            (Op::LessOrEqual, big, 0, big + 1, false),
            (
                Op::MaskedEqual,
                0xff00_0000_0000_00ff,
                0x1100_0000_0000_0022,
                0x11aa_0000_0000_bb22,
                true,
            ),
            (
                Op::MaskedEqual,
                0xff00_0000_0000_00ff,
                0x1100_0000_0000_0022,
                0x12aa_0000_0000_bb22,
                false,
            ),
        ] {
            let profile = Profile {
                default_action: Action::Errno(1),
                rules: vec![rule(
                    &["personality"],
                    Action::Allow,
                    vec![check(op, value, value_two)],
                )],
            };
            let program = assemble(&profile).expect("compiles");
            let expected = if holds { ALLOW } else { EPERM };
            let got = verdict(&program, libc::SYS_personality as u32, [0, arg, 0, 0, 0, 0]);
            assert_eq!(got, expected, "{op:?} {value:#x} against {arg:#x}");
        }
    }

    #[test]
    fn rules_are_tried_in_order_and_a_repeated_index_is_either() {
        let at = |index, value| ArgCheck {
            index,
            value,
            value_two: 0,
            op: Op::Equal,
        };
        let profile = Profile {
            default_action: Action::KillProcess,
            rules: vec![
                rule(&["socket"], Action::Errno(97), vec![at(0, 40)]),
                // Either family 1 or 2: one index twice.
                rule(&["socket"], Action::Allow, vec![at(0, 1), at(0, 2)]),
                rule(
                    &["socket", "connect"],
                    Action::Trap,
                    vec![at(0, 10), at(2, 6)],
                ),
            ],
        };
        let program = assemble(&profile).expect("compiles");
        let socket = libc::SYS_socket as u32;
        assert_eq!(
            verdict(&program, socket, [40, 0, 0, 0, 0, 0]),
            libc::SECCOMP_RET_ERRNO | 97
        );
        assert_eq!(verdict(&program, socket, [1, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(verdict(&program, socket, [2, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            verdict(&program, socket, [10, 0, 6, 0, 0, 0]),
            libc::SECCOMP_RET_TRAP
        );
        assert_eq!(
            verdict(&program, socket, [10, 0, 17, 0, 0, 0]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        let connect = libc::SYS_connect as u32;
        assert_eq!(
            verdict(&program, connect, [10, 0, 6, 0, 0, 0]),
            libc::SECCOMP_RET_TRAP
        );
        assert_eq!(
            verdict(&program, libc::SYS_read as u32, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }

    #[test]
    fn a_profile_as_large_as_containerds_fits_and_too_large_ones_are_refused() {
        // Every known call allowed, a third of them under a condition.
        let names: Vec<&str> = crate::syscall_table::SYSCALLS
            .iter()
            .map(|(n, _)| *n)
            .collect();
        let (plain, conditional) = names.split_at(names.len() * 2 / 3);
        let profile = Profile {
            default_action: Action::Errno(1),
            rules: vec![
                rule(plain, Action::Allow, vec![]),
                rule(
                    conditional,
                    Action::Allow,
                    vec![ArgCheck {
                        index: 0,
                        value: 7,
                        value_two: 0,
                        op: Op::NotEqual,
                    }],
                ),
            ],
        };
        let program = compile(&profile).expect("compiles");
        assert!(program.len() <= MAX_INSNS, "{}", program.len());
        let unpacked: Vec<Insn> = program.iter().map(|w| unpack(*w)).collect();
        assert_eq!(verdict(&unpacked, libc::SYS_read as u32, [0; 6]), ALLOW);
        let last = crate::syscall_table::SYSCALLS.last().expect("a call").1;
        assert_eq!(verdict(&unpacked, last, [7, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(verdict(&unpacked, last, [8, 0, 0, 0, 0, 0]), ALLOW);

        let many = Profile {
            default_action: Action::Allow,
            rules: (0..MAX_RULES + 1)
                .map(|_| rule(&["read"], Action::Allow, vec![]))
                .collect(),
        };
        assert!(matches!(
            compile(&many),
            Err(ProfileError::TooMany { what: "rules", .. })
        ));
        let long = Profile {
            default_action: Action::Allow,
            rules: (0..400)
                .map(|i| {
                    let check = |index| ArgCheck {
                        index,
                        value: i,
                        value_two: 0,
                        op: Op::Less,
                    };
                    rule(&["read"], Action::Trap, (0..6).map(check).collect())
                })
                .collect(),
        };
        assert!(matches!(
            compile(&long),
            Err(ProfileError::TooMany {
                what: "instructions compiled",
                ..
            })
        ));
    }

    #[test]
    fn actions_and_ops_are_named_as_oci_names_them() {
        assert_eq!(
            Action::parse("SCMP_ACT_ERRNO", Some(38)),
            Ok(Action::Errno(38))
        );
        assert_eq!(Action::parse("SCMP_ACT_KILL", None), Ok(Action::KillThread));
        assert!(matches!(
            Action::parse("SCMP_ACT_NOTIFY", None),
            Err(ProfileError::Action(_))
        ));
        assert_eq!(
            Action::parse("SCMP_ACT_ERRNO", Some(5000)),
            Err(ProfileError::Errno(5000))
        );
        assert!(matches!(
            Action::parse("SCMP_ACT_ALLOW", Some(1)),
            Err(ProfileError::ErrnoWithout(_))
        ));
        assert_eq!(Op::parse("SCMP_CMP_MASKED_EQ"), Ok(Op::MaskedEqual));
        assert!(Op::parse("SCMP_CMP_LIKE").is_err());
        let words = [0x0015_0102_0000_003eu64, 0x0006_0000_7fff_0000];
        for word in words {
            assert_eq!(pack(&unpack(word)), word);
        }
    }
}
