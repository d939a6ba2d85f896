//! Run with: `cargo run --release --example global_alloc`
//!
//! The smallest use of kmemcg in a program: install it as the global
//! allocator, run ordinary std code on a few threads, then print what the
//! allocator holds (`/proc/slabinfo` style) and give empty slabs back.

use std::collections::HashMap;
use std::thread;

use kmemcg::{Kmem, OsPages, PageSource};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn main() {
    let words: Vec<String> = (0..200_000).map(|i| format!("word-{}", i % 5_000)).collect();
    let counts: Vec<HashMap<String, usize>> = thread::scope(|s| {
        let handles: Vec<_> = words
            .chunks(words.len() / 4)
            .map(|chunk| {
                s.spawn(move || {
                    let mut m = HashMap::new();
                    for w in chunk {
                        *m.entry(w.clone()).or_insert(0) += 1;
                    }
                    m
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let distinct: usize = counts.iter().map(HashMap::len).sum();
    println!("4 threads counted {} words, {} (thread, word) pairs\n", words.len(), distinct);

    let info = KMEM.slabinfo().to_string();
    println!("busiest caches while the data is live:");
    let mut rows: Vec<&str> = info.lines().skip(2).filter(|l| l.split_whitespace().nth(1) != Some("0")).collect();
    rows.sort_by_key(|l| std::cmp::Reverse(l.split_whitespace().nth(1).and_then(|v| v.parse::<usize>().ok())));
    println!("{}", info.lines().nth(1).unwrap());
    for row in rows.iter().take(8) {
        println!("{row}");
    }

    drop(counts);
    drop(words);
    let before = KMEM.source().stats();
    let freed = KMEM.shrink();
    let after = KMEM.source().stats();
    println!(
        "\nafter freeing: shrink() gave back {freed} pages; pages in use {} -> {}, mapped {} -> {}",
        before.pages_in_use, after.pages_in_use, before.pages_reserved, after.pages_reserved
    );
}
