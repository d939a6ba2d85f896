//! Rust's v0 symbol mangling (`_R…`, RFC 2603), demangled into a report
//! without allocating: paths, generic arguments and types (function
//! pointers and trait objects without their associated-type bindings);
//! disambiguators, lifetimes and the instantiating crate left out, as
//! `rustc-demangle` prints them without `{:#}`. A name it does not
//! understand is printed as it is: [`write`] checks the whole name in a
//! dry run before it writes anything.

use core::fmt::Write;

/// How deep paths and types may nest (backreferences included), so a
/// malformed or hostile name cannot exhaust the signal stack.
const DEPTH_MAX: usize = 64;

/// A parse of `s` (the name after `_R`), writing to `out` unless it is a
/// dry run.
struct Parser<'a, 'o> {
    s: &'a [u8],
    i: usize,
    depth: usize,
    out: Option<&'o mut dyn Write>,
}

/// Parse failure: the name is printed as it is.
struct Bad;

type R = Result<(), Bad>;

impl<'a> Parser<'a, '_> {
    fn w(&mut self, s: &str) {
        if let Some(o) = self.out.as_deref_mut() {
            let _ = o.write_str(s);
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Result<u8, Bad> {
        let b = self.peek().ok_or(Bad)?;
        self.i += 1;
        Ok(b)
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        if hit {
            self.i += 1;
        }
        hit
    }

    /// `{0-9a-zA-Z} _`: `_` alone is 0, else the digits' value plus 1.
    fn base62(&mut self) -> Result<usize, Bad> {
        if self.eat(b'_') {
            return Ok(0);
        }
        let mut x: usize = 0;
        loop {
            let d = match self.next()? {
                b'_' => return x.checked_add(1).ok_or(Bad),
                c @ b'0'..=b'9' => c - b'0',
                c @ b'a'..=b'z' => c - b'a' + 10,
                c @ b'A'..=b'Z' => c - b'A' + 36,
                _ => return Err(Bad),
            };
            x = x.checked_mul(62).and_then(|x| x.checked_add(usize::from(d))).ok_or(Bad)?;
        }
    }

    fn decimal(&mut self) -> Result<usize, Bad> {
        let mut x: usize = 0;
        let mut any = false;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            self.i += 1;
            any = true;
            x = x.checked_mul(10).and_then(|x| x.checked_add(usize::from(c - b'0'))).ok_or(Bad)?;
        }
        if any { Ok(x) } else { Err(Bad) }
    }

    fn disambiguator(&mut self) -> R {
        if self.eat(b's') {
            self.base62()?;
        }
        Ok(())
    }

    /// An identifier (`u` marks Punycode, printed as it is).
    fn ident(&mut self) -> Result<&'a str, Bad> {
        self.disambiguator()?;
        self.eat(b'u');
        let n = self.decimal()?;
        self.eat(b'_');
        let end = self.i.checked_add(n).filter(|&e| e <= self.s.len()).ok_or(Bad)?;
        let s: &'a [u8] = self.s;
        let id = core::str::from_utf8(&s[self.i..end]).map_err(|_| Bad)?;
        self.i = end;
        Ok(id)
    }

    /// Runs `f` at the position a backreference names, then comes back.
    fn backref(&mut self, f: fn(&mut Self) -> R) -> R {
        let at = self.base62()?;
        if at >= self.i {
            return Err(Bad);
        }
        let back = core::mem::replace(&mut self.i, at);
        f(self)?;
        self.i = back;
        Ok(())
    }

    fn nest(&mut self, f: fn(&mut Self) -> R) -> R {
        self.depth += 1;
        if self.depth > DEPTH_MAX {
            return Err(Bad);
        }
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn path(&mut self) -> R {
        self.nest(Self::path_inner)
    }

    fn path_inner(&mut self) -> R {
        match self.next()? {
            b'C' => {
                let id = self.ident()?;
                self.w(id);
            }
            b'N' => {
                let ns = self.next()?;
                self.path()?;
                let id = self.ident()?;
                match ns {
                    b'C' => {
                        self.w("::{closure");
                        if !id.is_empty() {
                            self.w(":");
                            self.w(id);
                        }
                        self.w("}");
                    }
                    b'S' => {
                        self.w("::{shim:");
                        self.w(id);
                        self.w("}");
                    }
                    _ => {
                        self.w("::");
                        self.w(id);
                    }
                }
            }
            b'M' => {
                self.disambiguator()?;
                self.skip_path()?;
                self.w("<");
                self.ty()?;
                self.w(">");
            }
            b'X' => {
                self.disambiguator()?;
                self.skip_path()?;
                self.w("<");
                self.ty()?;
                self.w(" as ");
                self.path()?;
                self.w(">");
            }
            b'Y' => {
                self.w("<");
                self.ty()?;
                self.w(" as ");
                self.path()?;
                self.w(">");
            }
            b'I' => {
                self.path()?;
                self.w("::<");
                self.args()?;
                self.w(">");
            }
            b'B' => self.backref(Self::path)?,
            _ => return Err(Bad),
        }
        Ok(())
    }

    /// An impl's own path, which the printed name leaves out.
    fn skip_path(&mut self) -> R {
        let out = self.out.take();
        let r = self.path();
        self.out = out;
        r
    }

    /// Generic arguments up to `E`, comma-separated; lifetimes skipped.
    fn args(&mut self) -> R {
        let mut first = true;
        while !self.eat(b'E') {
            if self.eat(b'L') {
                self.base62()?;
                continue;
            }
            if !first {
                self.w(", ");
            }
            first = false;
            if self.eat(b'K') {
                self.konst()?;
            } else {
                self.ty()?;
            }
        }
        Ok(())
    }

    /// A constant: its type and value, printed as `_` (or a backref).
    fn konst(&mut self) -> R {
        if self.eat(b'p') {
            self.w("_");
            return Ok(());
        }
        if self.eat(b'B') {
            return self.backref(Self::konst);
        }
        let out = self.out.take();
        let r = self.ty();
        self.out = out;
        r?;
        self.eat(b'n');
        while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
            self.i += 1;
        }
        if !self.eat(b'_') {
            return Err(Bad);
        }
        self.w("_");
        Ok(())
    }

    fn ty(&mut self) -> R {
        self.nest(Self::ty_inner)
    }

    fn ty_inner(&mut self) -> R {
        let c = self.peek().ok_or(Bad)?;
        let basic = match c {
            b'a' => "i8",
            b'b' => "bool",
            b'c' => "char",
            b'd' => "f64",
            b'e' => "str",
            b'f' => "f32",
            b'h' => "u8",
            b'i' => "isize",
            b'j' => "usize",
            b'l' => "i32",
            b'm' => "u32",
            b'n' => "i128",
            b'o' => "u128",
            b's' => "i16",
            b't' => "u16",
            b'u' => "()",
            b'v' => "...",
            b'x' => "i64",
            b'y' => "u64",
            b'z' => "!",
            b'p' => "_",
            _ => "",
        };
        if !basic.is_empty() {
            self.i += 1;
            self.w(basic);
            return Ok(());
        }
        self.i += 1;
        match c {
            b'R' | b'Q' => {
                self.w(if c == b'R' { "&" } else { "&mut " });
                if self.eat(b'L') {
                    self.base62()?;
                }
                self.ty()?;
            }
            b'P' | b'O' => {
                self.w(if c == b'P' { "*const " } else { "*mut " });
                self.ty()?;
            }
            b'A' => {
                self.w("[");
                self.ty()?;
                self.w("; ");
                self.konst()?;
                self.w("]");
            }
            b'S' => {
                self.w("[");
                self.ty()?;
                self.w("]");
            }
            b'T' => {
                self.w("(");
                let mut n = 0;
                while !self.eat(b'E') {
                    if n > 0 {
                        self.w(", ");
                    }
                    self.ty()?;
                    n += 1;
                }
                self.w(if n == 1 { ",)" } else { ")" });
            }
            b'F' => {
                if self.eat(b'G') {
                    self.base62()?;
                }
                let unsafety = self.eat(b'U');
                if self.eat(b'K') && !self.eat(b'C') {
                    self.ident()?;
                }
                self.w(if unsafety { "unsafe fn(" } else { "fn(" });
                let mut first = true;
                while !self.eat(b'E') {
                    if !first {
                        self.w(", ");
                    }
                    first = false;
                    self.ty()?;
                }
                self.w(")");
                if self.eat(b'u') {
                    return Ok(());
                }
                self.w(" -> ");
                self.ty()?;
            }
            // `dyn A + B` (associated-type bindings parsed, not printed).
            b'D' => {
                if self.eat(b'G') {
                    self.base62()?;
                }
                self.w("dyn ");
                let mut first = true;
                while !self.eat(b'E') {
                    if !first {
                        self.w(" + ");
                    }
                    first = false;
                    self.path()?;
                    while self.eat(b'p') {
                        let out = self.out.take();
                        let r = self.ident().map(|_| ()).and_then(|()| self.ty());
                        self.out = out;
                        r?;
                    }
                }
                if !self.eat(b'L') {
                    return Err(Bad);
                }
                self.base62()?;
            }
            b'B' => self.backref(Self::ty)?,
            b'C' | b'M' | b'X' | b'Y' | b'N' | b'I' => {
                self.i -= 1;
                self.path()?;
            }
            _ => return Err(Bad),
        }
        Ok(())
    }
}

/// Writes the v0-mangled `name` (with its `_R`) demangled, or as it is
/// if it is not one this parser reads; returns whether it was.
pub(super) fn write(out: &mut dyn Write, name: &[u8]) -> bool {
    let Some(s) = name.strip_prefix(b"_R") else { return false };
    // A leading decimal is the encoding version (none: 0).
    let start = s.iter().take_while(|c| c.is_ascii_digit()).count();
    if (Parser { s, i: start, depth: 0, out: None }).path().is_err() {
        return false;
    }
    let mut p = Parser { s, i: start, depth: 0, out: Some(out) };
    p.path().is_ok()
}
