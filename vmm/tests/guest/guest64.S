# crucible's 64-bit test guest, entered through the Linux 64-bit boot protocol
# (long mode, identity-mapped, rsi = zero page). It checks what the VMM handed it, reports on
# the serial port, probes the virtio-mmio windows (console, block, vsock), writes the
# boot-complete marker and resets through the i8042. Any failed check prints "FAIL <letter>"
# and triple-faults (ud2 with an empty IDT), which the VMM reports as a guest crash.
#
# Rebuild: as --64 -o g.o guest64.S && ld -Ttext=0x100000 --oformat binary -o guest64.bin g.o
.intel_syntax noprefix
.code64
.globl _start
_start:
    mov bl, 'A'
    cmp rsp, 0x8ff0                   # A: the boot stack
    jne fail
    mov r15, rsi
    lea rsi, [rip + hello]
    call puts
    mov bl, 'B'
    cmp r15, 0x7000                   # B: rsi = zero page
    jne fail
    mov bl, 'C'
    cmp word ptr [r15 + 0x1fe], 0xaa55   # C: boot_flag
    jne fail
    mov bl, 'D'
    cmp dword ptr [r15 + 0x202], 0x53726448  # D: "HdrS"
    jne fail
    mov bl, 'E'
    mov eax, dword ptr [r15 + 0x228]  # E: cmd_line_ptr -> "reboot=k"
    cmp dword ptr [rax], 0x6f626572
    jne fail
    mov bl, 'F'
    cmp byte ptr [r15 + 0x1e8], 3     # F: at least 3 e820 entries
    jb fail
    mov bl, 'G'
    cmp dword ptr [r15 + 0x2d0 + 16], 1  # G: e820[0] is RAM
    jne fail
    mov bl, 'H'
    mov ecx, 0xc0000080               # H: EFER.LMA
    rdmsr
    test eax, 0x400
    jz fail
    mov bl, 'I'
    mov ax, cs                        # I: CS = GDT entry 1
    cmp ax, 8
    jne fail
    mov bl, 'J'
    mov rax, cr0                      # J: paging on
    bt rax, 31
    jnc fail
    mov bl, 'K'
    mov rax, cr4                      # K: PAE
    bt rax, 5
    jnc fail
    lea rsi, [rip + boot_ok]
    call puts

    # Map 2 MiB at 0xd0000000 (uncached) for the virtio-mmio windows: PDPT[3] -> PD at 0xc000.
    mov rax, cr3
    mov rdi, [rax]
    and rdi, -4096
    mov qword ptr [rdi + 24], 0xc003
    mov eax, 0xd0000093
    mov qword ptr [0xc000 + 128 * 8], rax
    mov rax, cr3
    mov cr3, rax

    mov rbp, 0xd0000000
    mov bl, 'L'
    mov r8d, 3                        # L: console at window 0
    call probe
    add rbp, 0x1000
    mov bl, 'M'
    mov r8d, 2                        # M: block at window 1
    call probe
    add rbp, 0x1000
    mov bl, 'N'
    mov r8d, 19                       # N: vsock at window 2
    call probe
    lea rsi, [rip + mmio_ok]
    call puts

    mov dx, 0x3f0                     # the boot-complete marker
    mov al, 123
    out dx, al
    lea rsi, [rip + bye]
    call puts
    mov al, 0xfe                      # i8042 reset
    out 0x64, al
1:  hlt
    jmp 1b

# Checks magic, version and device id of the window at rbp against r8d.
probe:
    mov eax, dword ptr [rbp]
    cmp eax, 0x74726976
    jne fail
    mov eax, dword ptr [rbp + 4]
    cmp eax, 2
    jne fail
    mov eax, dword ptr [rbp + 8]
    cmp eax, r8d
    jne fail
    ret

fail:
    lea rsi, [rip + failmsg]
    call puts
    mov dx, 0x3f8
    mov al, bl
    out dx, al
    mov al, 10
    out dx, al
    ud2

puts:
    mov dx, 0x3f8
2:  lodsb
    test al, al
    jz 3f
    out dx, al
    jmp 2b
3:  ret

hello:   .asciz "test-guest: entered (64-bit boot protocol)\n"
boot_ok: .asciz "test-guest: boot_params, e820, cmdline, long mode ok\n"
mmio_ok: .asciz "test-guest: virtio-mmio console/block/vsock ok\n"
bye:     .asciz "test-guest: resetting\n"
failmsg: .asciz "test-guest: FAIL "
