//! The multiboot header and the 32-bit entry stub.
//!
//! A multiboot loader jumps to `_start` in 32-bit protected mode with
//! paging off, `eax` = the multiboot magic and `ebx` = the physical address
//! of the boot information. The stub zeroes `.bss`, identity-maps the first
//! 4 GiB with 2 MiB pages, turns on PAE, long mode and paging, loads a
//! 64-bit GDT, far-returns into 64-bit code and calls
//! `kmain(magic, info)` on a 128 KiB stack, with interrupts disabled
//! (`kmain` loads an IDT before it enables any). The application
//! processors share these page tables and GDT layout (`smp.rs`). There is
//! no CPUID check for long mode: QEMU's default x86_64 CPU model has it.

use core::arch::global_asm;

global_asm!(
    // Multiboot v1 header: flags bit 0 (modules page aligned) and bit 1
    // (memory information, including the memory map, wanted).
    ".pushsection .multiboot, \"a\"",
    ".balign 4",
    ".long 0x1BADB002",
    ".long 0x00000003",
    ".long -(0x1BADB002 + 0x00000003)",
    ".popsection",
    //
    ".pushsection .text.boot, \"ax\"",
    ".code32",
    ".global _start",
    "_start:",
    "    cli",
    "    cld",
    "    mov esi, ebx", // multiboot info: `ebx` is reused below
    "    mov ebp, eax", // multiboot magic
    // Zero .bss (statics, page tables, stack); the loader is not trusted to.
    "    mov edi, offset __bss_start",
    "    mov ecx, offset __bss_end",
    "    sub ecx, edi",
    "    shr ecx, 2",
    "    xor eax, eax",
    "    rep stosd",
    "    mov esp, offset boot_stack_top",
    // PML4[0] -> PDPT.
    "    mov eax, offset boot_pdpt",
    "    or eax, 3", // present, writable
    "    mov dword ptr [boot_pml4], eax",
    // PDPT[0..4] -> the four page directories.
    "    xor ecx, ecx",
    "2:",
    "    mov eax, ecx",
    "    shl eax, 12",
    "    add eax, offset boot_pd",
    "    or eax, 3",
    "    mov dword ptr [boot_pdpt + ecx * 8], eax",
    "    inc ecx",
    "    cmp ecx, 4",
    "    jne 2b",
    // PD entries 0..2048: 2 MiB page i at physical i * 2 MiB.
    "    xor ecx, ecx",
    "3:",
    "    mov eax, ecx",
    "    shl eax, 21",
    "    or eax, 0x83", // present, writable, page size
    "    mov dword ptr [boot_pd + ecx * 8], eax",
    "    inc ecx",
    "    cmp ecx, 2048",
    "    jne 3b",
    // CR3, then PAE, then EFER.LME, then paging: long mode is active.
    "    mov eax, offset boot_pml4",
    "    mov cr3, eax",
    "    mov eax, cr4",
    "    or eax, 1 << 5",
    "    mov cr4, eax",
    "    mov ecx, 0xC0000080",
    "    rdmsr",
    "    or eax, 1 << 8",
    "    wrmsr",
    "    mov eax, cr0",
    "    or eax, (1 << 31) | 1",
    "    mov cr0, eax",
    // Still in compatibility mode: load a GDT with a 64-bit code segment
    // and far-return into it.
    "    lgdt [boot_gdt64_ptr]",
    "    push 0x08",
    "    mov eax, offset boot_start64",
    "    push eax",
    "    retf",
    //
    ".code64",
    "boot_start64:",
    "    mov ax, 0x10",
    "    mov ds, ax",
    "    mov es, ax",
    "    mov ss, ax",
    "    mov fs, ax",
    "    mov gs, ax",
    "    lea rsp, [rip + boot_stack_top]",
    "    mov edi, ebp", // kmain(magic, info), zero-extended
    "    mov esi, esi",
    "    xor ebp, ebp",
    "    call {kmain}",
    "4:",
    "    cli",
    "    hlt",
    "    jmp 4b",
    //
    // Null, 64-bit code (selector 0x08), data (selector 0x10).
    ".balign 8",
    "boot_gdt64:",
    "    .quad 0",
    "    .quad 0x00AF9A000000FFFF",
    "    .quad 0x00CF92000000FFFF",
    "boot_gdt64_ptr:",
    "    .word boot_gdt64_ptr - boot_gdt64 - 1",
    "    .quad boot_gdt64",
    ".popsection",
    //
    ".pushsection .bss.boot, \"aw\", @nobits",
    ".balign 4096",
    "boot_pml4:",
    "    .skip 4096",
    "boot_pdpt:",
    "    .skip 4096",
    "boot_pd:",
    "    .skip 4096 * 4",
    "    .skip 128 * 1024",
    "boot_stack_top:",
    ".popsection",
    kmain = sym super::kmain,
);
