//! Names as a report prints them.

use std::string::String;

use super::{Out, write_name};

/// `name` as `write_name` writes it (short enough to stay in the buffer).
fn demangled(name: &str) -> String {
    let mut out = Out::new();
    write_name(&mut out, name.as_bytes());
    let s = String::from_utf8(out.buf[..out.n].to_vec()).unwrap();
    // Nothing left for the drop to write to standard error.
    out.n = 0;
    s
}

#[test]
fn legacy_names_lose_their_hash_and_escapes() {
    assert_eq!(demangled("_ZN6kmemcg4heap4Kmem5alloc17h0123456789abcdefE"), "kmemcg::heap::Kmem::alloc");
    assert_eq!(
        demangled(
            "_ZN88_$LT$kmemcg..heap..Kmem$LT$S$C$R$C$P$GT$$u20$as$u20$core..alloc..global..GlobalAlloc$GT$5alloc17h0123456789abcdefE"
        ),
        "<kmemcg::heap::Kmem<S,R,P> as core::alloc::global::GlobalAlloc>::alloc"
    );
}

#[test]
fn v0_names_are_demangled() {
    assert_eq!(
        demangled("_RNvNtNtCsjrHSEGnQ3l9_3std3sys9backtrace28___rust_begin_short_backtrace"),
        "std::sys::backtrace::__rust_begin_short_backtrace"
    );
    // Generic arguments and a closure; the instantiating crate (`B1b_`)
    // is left out.
    assert_eq!(
        demangled(
            "_RINvNtNtCsjrHSEGnQ3l9_3std3sys9backtrace28___rust_begin_short_backtraceNCNvCs3mSbOeLENLV_4test8run_tests_0uEB1b_"
        ),
        "std::sys::backtrace::__rust_begin_short_backtrace::<test::run_test::{closure#1}, ()>"
    );
}

#[test]
fn other_names_print_as_they_are() {
    assert_eq!(demangled("memcpy"), "memcpy");
    // Not a mangling `rustc-demangle` reads: the whole name, nothing
    // half-written.
    assert_eq!(demangled("_RZZ"), "_RZZ");
    // A backreference past the name.
    assert_eq!(demangled("_RNvB9999_3foo"), "_RNvB9999_3foo");
}
