//! Return addresses named when a report is printed (`std`, Linux with
//! glibc): `function+0xoffset (module)`, without allocating, so a report
//! made inside the allocator (a free that found a red zone overwritten)
//! cannot recurse into it.
//!
//! `dladdr(3)` gives the module and its load address, and a name only
//! for symbols the module exports (its dynamic symbol table). Functions
//! of a Rust program are not exported, so the module's ELF file is read
//! as well (`/proc/self/exe` for the main program, found by its program
//! headers' address from `getauxval(AT_PHDR)`; the path the loader gives
//! for a shared library): its section headers, then its `.symtab`, a
//! chunk at a time into a buffer on the stack, for the function symbol
//! covering the address, and the name from its string table. Rust's
//! manglings, legacy (`_ZN…17h<hash>E`) and v0 (`_R…`, the standard
//! library's), are demangled on the way out by `rustc-demangle`, hashes
//! and crate disambiguators left out; other names print as they are.
//!
//! A stripped binary (`strip = "symbols"`, or `strip` run on it) has no
//! `.symtab`: its frames print as module and offset, which `addr2line -e
//! <module>` resolves. 64-bit little-endian ELF only; anything else
//! prints module and offset too. The position-independent case assumes
//! the module's first segment is at virtual address 0, as linkers lay
//! out shared objects and PIE programs.
//!
//! A guard-page fault's report runs this in its `SIGSEGV` handler, on the
//! signal stack (hence buffers of about 2 KB in all): `open`, `pread` and
//! `close` are async-signal-safe; `dladdr` is not on that list (glibc
//! takes the loader's lock), so a fault on a sampled object made while
//! the faulting thread is inside the dynamic loader could hang the report
//! instead of printing it.

#[cfg(test)]
mod tests;

use core::ffi::CStr;
use core::fmt::{self, Write};

/// Standard error with a line buffer: written with `write(2)`, never
/// allocating.
pub(super) struct Out {
    buf: [u8; 128],
    n: usize,
}

impl Out {
    pub(super) const fn new() -> Self {
        Out { buf: [0; 128], n: 0 }
    }

    pub(super) fn flush(&mut self) {
        // SAFETY: the first `n` bytes of `buf`, written to fd 2; touches no
        // memory of ours and does not allocate.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.n) };
        self.n = 0;
    }
}

impl Write for Out {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for &b in s.as_bytes() {
            if self.n == self.buf.len() {
                self.flush();
            }
            self.buf[self.n] = b;
            self.n += 1;
        }
        Ok(())
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The symbol table bytes read per `pread` (64 symbols): small, as a
/// guard-page fault's report runs on the signal stack.
const CHUNK: usize = 24 * 64;
/// The longest name read from a string table.
const NAME_MAX: usize = 256;

/// Section types.
const SHT_SYMTAB: u32 = 2;
/// ELF file type of a program linked at fixed addresses.
const ET_EXEC: u16 = 2;
/// `st_info`'s type of a function.
const STT_FUNC: u8 = 2;

/// An open file, closed on drop.
struct File(libc::c_int);

impl File {
    fn open(path: &CStr) -> Option<File> {
        // SAFETY: a NUL-terminated path; `open` allocates nothing of ours.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        (fd >= 0).then_some(File(fd))
    }

    /// Fills `buf` from `off`; whether it was read whole.
    fn read_at(&self, buf: &mut [u8], off: u64) -> bool {
        let mut done = 0;
        while done < buf.len() {
            let Ok(o) = libc::off_t::try_from(off + done as u64) else { return false };
            // SAFETY: writes at most `buf.len() - done` bytes into `buf`
            // past `done`.
            let r = unsafe { libc::pread(self.0, buf[done..].as_mut_ptr().cast(), buf.len() - done, o) };
            if r <= 0 {
                return false;
            }
            done += r as usize;
        }
        true
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// A function symbol found in a file: the string-table offset of its
/// name and its start, as a link-time address.
#[derive(Clone, Copy)]
struct Found {
    name: u64,
    value: u64,
}

/// The function of `file` that covers link-time address `a`, and the
/// file's string table's offset, from its `.symtab`.
fn lookup(file: &File, a: u64) -> Option<(Found, u64)> {
    let mut eh = [0u8; 64];
    // 64-bit (class 2), little-endian (data 1).
    if !file.read_at(&mut eh, 0) || eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let (shoff, shentsize, shnum) = (u64_at(&eh, 0x28), u64::from(u16_at(&eh, 0x3a)), u64::from(u16_at(&eh, 0x3c)));
    if shentsize < 64 {
        return None;
    }
    let mut sh = [0u8; 64];
    let section = |i: u64, sh: &mut [u8; 64]| file.read_at(sh, shoff + i * shentsize);
    let (symoff, symsize, link) = (0..shnum).find_map(|i| {
        let mut s = [0u8; 64];
        (section(i, &mut s) && u32_at(&s, 4) == SHT_SYMTAB)
            .then(|| (u64_at(&s, 0x18), u64_at(&s, 0x20), u32_at(&s, 0x28)))
    })?;
    if !section(u64::from(link), &mut sh) {
        return None;
    }
    let stroff = u64_at(&sh, 0x18);
    let mut best: Option<Found> = None;
    let mut chunk = [0u8; CHUNK];
    let mut off = 0;
    while off < symsize {
        let len = (symsize - off).min(CHUNK as u64) as usize / 24 * 24;
        if len == 0 || !file.read_at(&mut chunk[..len], symoff + off) {
            break;
        }
        for s in chunk[..len].chunks_exact(24) {
            let (value, size) = (u64_at(s, 8), u64_at(s, 16));
            if s[4] & 0xf == STT_FUNC && value <= a && a < value + size.max(1) && best.is_none_or(|b| value > b.value) {
                best = Some(Found { name: u64::from(u32_at(s, 0)), value });
            }
        }
        off += len as u64;
    }
    Some((best?, stroff))
}

/// Writes a symbol name, demangled if it is one of Rust's manglings
/// (legacy or v0, by `rustc-demangle`, which neither allocates nor
/// panics), hashes and disambiguators left out; anything else as it is.
fn write_name(out: &mut impl Write, name: &[u8]) {
    let Ok(name) = core::str::from_utf8(name) else {
        let _ = out.write_str("?");
        return;
    };
    let _ = match rustc_demangle::try_demangle(name) {
        Ok(d) => write!(out, "{d:#}"),
        Err(_) => out.write_str(name),
    };
}

/// The load address of the main program (of its first segment), from
/// where its program headers are mapped.
fn main_base() -> usize {
    // SAFETY: `getauxval` reads the auxiliary vector; no memory of ours.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) } as usize;
    // SAFETY: a zeroed `Dl_info` is valid (null pointers); `dladdr` only
    // writes it.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `info` is valid for writes; the address is only looked up.
    if phdr == 0 || unsafe { libc::dladdr(core::ptr::without_provenance(phdr), &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase.addr()
}

/// Writes one frame's line: `    #i 0x… name+0xoff (module)`.
pub(super) fn print_frame(out: &mut impl Write, i: usize, addr: usize) {
    let _ = write!(out, "    #{i} {addr:#x} ");
    // SAFETY: a zeroed `Dl_info` is valid (null pointers).
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `info` is valid for writes; the address is only looked up.
    if unsafe { libc::dladdr(core::ptr::without_provenance(addr), &mut info) } == 0 {
        let _ = out.write_str("?\n");
        return;
    }
    let base = info.dli_fbase.addr();
    let module: &CStr = if info.dli_fname.is_null() {
        c"?"
    } else {
        // SAFETY: `dladdr` names the module with a NUL-terminated string
        // of the loader's, alive while the module is loaded.
        unsafe { CStr::from_ptr(info.dli_fname) }
    };
    let path: &CStr = if base == main_base() { c"/proc/self/exe" } else { module };
    let named = File::open(path).and_then(|f| {
        let mut eh = [0u8; 18];
        // Link-time addresses: the load address taken off unless the
        // file is a program linked at fixed addresses. A return address
        // less one: the call, even when it is a function's last
        // instruction.
        let bias = if f.read_at(&mut eh, 0) && u16_at(&eh, 16) == ET_EXEC { 0 } else { base };
        let a = addr.wrapping_sub(bias) as u64;
        let (found, stroff) = lookup(&f, a.wrapping_sub(1))?;
        let mut name = [0u8; NAME_MAX];
        let mut n = 0;
        while n < NAME_MAX {
            let step = (NAME_MAX - n).min(64);
            if !f.read_at(&mut name[n..n + step], stroff + found.name + n as u64) {
                break;
            }
            if let Some(z) = name[n..n + step].iter().position(|&b| b == 0) {
                n += z;
                break;
            }
            n += step;
        }
        Some((name, n, a - found.value))
    });
    match named {
        Some((name, n, off)) if n > 0 => {
            write_name(out, &name[..n]);
            let _ = write!(out, "+{off:#x}");
        }
        _ if !info.dli_sname.is_null() => {
            // SAFETY: as for `dli_fname`.
            let s = unsafe { CStr::from_ptr(info.dli_sname) };
            write_name(out, s.to_bytes());
            let _ = write!(out, "+{:#x}", addr.wrapping_sub(info.dli_saddr.addr()));
        }
        _ => {
            let _ = write!(out, "+{:#x}", addr.wrapping_sub(base));
        }
    }
    let _ = writeln!(out, " ({})", module.to_str().unwrap_or("?"));
}
