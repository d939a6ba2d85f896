#![cfg(loom)]
use kmemcg::{Kmem, OsPages};
use std::alloc::{GlobalAlloc, Layout};

#[test]
fn size() {
    eprintln!("size_of Kmem = {}", std::mem::size_of::<Kmem>());
}

#[test]
fn plain_model() {
    loom::model(|| {
        let k = Box::new(Kmem::new(OsPages::new()));
        let l = Layout::new::<u64>();
        unsafe { k.dealloc(k.alloc(l), l) };
    });
}
