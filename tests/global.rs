//! Installs `Kmem` as the global allocator and runs ordinary std code from
//! several threads: collections, strings, formatting, shared state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use kmemcg::{Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn workload(id: usize, rounds: usize) -> u64 {
    let mut sum = 0u64;
    for r in 0..rounds {
        let mut v: Vec<u64> = (0..(r % 700) as u64).collect();
        v.retain(|x| x % 3 != 0);
        v.shrink_to_fit();
        sum += v.iter().sum::<u64>();

        let mut m: HashMap<String, Vec<u8>> = HashMap::new();
        for k in 0..50 {
            m.insert(format!("t{id}-r{r}-k{k}"), vec![k as u8; k * 37]);
        }
        for k in 0..50 {
            let val = &m[&format!("t{id}-r{r}-k{k}")];
            assert_eq!(val.len(), k * 37);
            assert!(val.iter().all(|&b| b == k as u8));
        }

        let mut b = BTreeMap::new();
        for k in 0..200u32 {
            b.insert(k.wrapping_mul(2_654_435_761), k.to_string());
        }
        assert_eq!(b.len(), 200);

        let mut s = String::new();
        for k in 0..100 {
            s.push_str(&k.to_string());
        }
        sum += s.len() as u64;

        let mut q: VecDeque<Box<[u8]>> = VecDeque::new();
        for k in 0..64 {
            q.push_back(vec![k as u8; 1 << (k % 17)].into_boxed_slice());
            if q.len() > 8 {
                let x = q.pop_front().unwrap();
                assert!(x.iter().all(|&y| y == x[0]));
            }
        }
    }
    sum
}

#[test]
fn std_code_on_four_threads() {
    let threads = 4;
    let barrier = Arc::new(Barrier::new(threads));
    let shared = Arc::new(Mutex::new(Vec::<String>::new()));
    let handles: Vec<_> = (0..threads)
        .map(|id| {
            let barrier = Arc::clone(&barrier);
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                barrier.wait();
                let s = workload(id, 60);
                // Objects allocated here are freed by whichever thread
                // drops the vector last.
                shared.lock().unwrap().push(format!("thread {id}: {s}"));
                s
            })
        })
        .collect();
    let sums: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(sums.windows(2).all(|w| w[0] == w[1]), "deterministic work gave {sums:?}");
    assert_eq!(shared.lock().unwrap().len(), threads);
    // The report formats into memory from this very allocator.
    let info = KMEM.slabinfo().to_string();
    assert!(info.lines().count() > 40);
    assert_eq!(KMEM.stats().bad_frees, 0);
}

#[test]
fn large_and_over_aligned_blocks() {
    #[repr(align(65536))]
    struct Big([u8; 100]);
    let b = Box::new(Big([3; 100]));
    assert_eq!(&*b as *const Big as usize % 65536, 0);
    let mut v = vec![0u8; 10 << 20];
    v[(10 << 20) - 1] = 1;
    v.resize(30 << 20, 2);
    assert_eq!(v[(30 << 20) - 1], 2);
    assert_eq!(b.0[99], 3);
}
