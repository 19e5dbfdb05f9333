# crucible's PVH test guest: entered in 32-bit protected mode, paging off, ebx = hvm_start_info.
# Checks the start info (magic, version, command line, memory map), reports on the serial port,
# probes the virtio-mmio windows, writes the boot-complete marker and resets through the
# i8042. A failed check prints "FAIL <letter>" and triple-faults.
#
# Rebuild: as --32 -o g.o guest32.S && ld -m elf_i386 -Ttext=0x100000 --oformat binary -o guest32.bin g.o
.intel_syntax noprefix
.code32
.globl _start
_start:
    mov esp, 0x8ff0
    mov edi, ebx
    mov esi, offset hello
    call puts
    mov bl, 'B'
    cmp edi, 0x6000                    # B: ebx = start info
    jne fail
    mov bl, 'C'
    cmp dword ptr [edi], 0x336ec578    # C: magic
    jne fail
    mov bl, 'D'
    cmp dword ptr [edi + 4], 1         # D: version 1 (memory map present)
    jne fail
    mov bl, 'E'
    mov eax, dword ptr [edi + 24]      # E: cmdline_paddr -> "reboot=k"
    cmp dword ptr [eax], 0x6f626572
    jne fail
    mov bl, 'F'
    cmp dword ptr [edi + 48], 3        # F: at least 3 memory map entries
    jb fail
    mov bl, 'G'
    mov eax, dword ptr [edi + 40]      # G: memmap[0] is RAM
    cmp dword ptr [eax + 16], 1
    jne fail
    mov bl, 'H'
    mov eax, cr0                       # H: protected mode, paging off
    test eax, 1
    jz fail
    test eax, 0x80000000
    jnz fail
    mov bl, 'I'
    mov ax, cs
    cmp ax, 8
    jne fail
    mov esi, offset boot_ok
    call puts

    mov ebp, 0xd0000000
    mov bl, 'L'
    mov ecx, 3
    call probe
    add ebp, 0x1000
    mov bl, 'M'
    mov ecx, 2
    call probe
    add ebp, 0x1000
    mov bl, 'N'
    mov ecx, 19
    call probe
    mov esi, offset mmio_ok
    call puts

    mov dx, 0x3f0
    mov al, 123
    out dx, al
    mov esi, offset bye
    call puts
    mov al, 0xfe
    out 0x64, al
1:  hlt
    jmp 1b

probe:
    mov eax, dword ptr [ebp]
    cmp eax, 0x74726976
    jne fail
    mov eax, dword ptr [ebp + 4]
    cmp eax, 2
    jne fail
    mov eax, dword ptr [ebp + 8]
    cmp eax, ecx
    jne fail
    ret

fail:
    mov esi, offset failmsg
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

hello:   .asciz "test-guest: entered (PVH)\n"
boot_ok: .asciz "test-guest: start info, memory map, cmdline, protected mode ok\n"
mmio_ok: .asciz "test-guest: virtio-mmio console/block/vsock ok\n"
bye:     .asciz "test-guest: resetting\n"
failmsg: .asciz "test-guest: FAIL "
