//! Where a forward pass spends its time: an opt-in account of wall time by part (the norms,
//! each product, attention, ...), kept by the thread that calls `forward`.
//!
//! The forward pass marks the end of each part with `mark` (or `mark_product` for a
//! product, with the bytes of weights it read and its multiply-adds); the time since the previous mark, or since the
//! pass began, goes to that part. Parts of the same name add up over layers and passes. Off
//! unless [`start`] was called on the thread: a mark then costs one thread-local flag check,
//! and nothing the pass computes depends on it.
//!
//! Work handed to the pool is inside the caller's part (the caller waits for it), so the
//! account is the wall time of the calling thread, which is what a user waits for.

use std::cell::RefCell;
use std::time::Instant;

/// One part of the forward pass, summed over every time it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub name: &'static str,
    /// Times it ran.
    pub calls: u64,
    pub nanos: u64,
    /// Bytes of weights its products read (0 for parts that are not products).
    pub weight_bytes: u64,
    /// Multiply-adds its products did (weights x tokens).
    pub macs: u64,
}

struct Account {
    last: Instant,
    parts: Vec<Part>,
}

thread_local! {
    static ACCOUNT: RefCell<Option<Account>> = const { RefCell::new(None) };
}

/// Keep an account of the forward passes this thread runs from now on (an empty one).
pub fn start() {
    ACCOUNT.with(|a| {
        *a.borrow_mut() = Some(Account {
            last: Instant::now(),
            parts: Vec::new(),
        })
    });
}

/// Stop keeping the account and return it: the parts in the order they first ran.
pub fn stop() -> Vec<Part> {
    ACCOUNT.with(|a| a.borrow_mut().take().map_or_else(Vec::new, |acc| acc.parts))
}

/// Add the parts of `more` to `into`, by name (new names at the end).
pub fn merge(into: &mut Vec<Part>, more: Vec<Part>) {
    for m in more {
        match into.iter_mut().find(|p| p.name == m.name) {
            Some(p) => {
                p.calls += m.calls;
                p.nanos += m.nanos;
                p.weight_bytes += m.weight_bytes;
                p.macs += m.macs;
            }
            None => into.push(m),
        }
    }
}

/// A forward pass begins: what ran since the last mark is not the pass's.
#[inline]
pub(crate) fn begin() {
    ACCOUNT.with(|a| {
        if let Some(acc) = a.borrow_mut().as_mut() {
            acc.last = Instant::now();
        }
    });
}

/// The part `name` ends here.
#[inline]
pub(crate) fn mark(name: &'static str) {
    mark_product(name, 0, 0);
}

/// The part `name`, a product that read `weight_bytes` of weights and did `macs`
/// multiply-adds, ends here.
#[inline]
pub(crate) fn mark_product(name: &'static str, weight_bytes: u64, macs: u64) {
    ACCOUNT.with(|a| {
        if let Some(acc) = a.borrow_mut().as_mut() {
            let now = Instant::now();
            let nanos = now.duration_since(acc.last).as_nanos() as u64;
            acc.last = now;
            let part = match acc.parts.iter().position(|p| p.name == name) {
                Some(i) => &mut acc.parts[i],
                None => {
                    acc.parts.push(Part {
                        name,
                        calls: 0,
                        nanos: 0,
                        weight_bytes: 0,
                        macs: 0,
                    });
                    acc.parts.last_mut().expect("just pushed")
                }
            };
            part.calls += 1;
            part.nanos += nanos;
            part.weight_bytes += weight_bytes;
            part.macs += macs;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_by_name_in_first_run_order() {
        mark("before"); // off: not counted
        start();
        begin();
        mark("a");
        mark_product("w", 100, 7);
        std::thread::sleep(std::time::Duration::from_millis(2));
        mark("a");
        mark_product("w", 50, 3);
        let parts = stop();
        let names: Vec<_> = parts.iter().map(|p| p.name).collect();
        assert_eq!(names, ["a", "w"]);
        assert_eq!((parts[0].calls, parts[1].calls), (2, 2));
        assert_eq!((parts[0].weight_bytes, parts[1].weight_bytes), (0, 150));
        assert_eq!((parts[0].macs, parts[1].macs), (0, 10));
        assert!(parts[0].nanos >= 2_000_000, "{parts:?}");
        mark("after"); // off again
        assert!(stop().is_empty());

        let mut into = parts.clone();
        merge(
            &mut into,
            vec![
                Part {
                    name: "x",
                    calls: 1,
                    nanos: 7,
                    weight_bytes: 0,
                    macs: 0,
                },
                Part {
                    name: "w",
                    calls: 1,
                    nanos: 3,
                    weight_bytes: 10,
                    macs: 1,
                },
            ],
        );
        let names: Vec<_> = into.iter().map(|p| p.name).collect();
        assert_eq!(names, ["a", "w", "x"]);
        assert_eq!(
            (
                into[1].calls,
                into[1].nanos,
                into[1].weight_bytes,
                into[1].macs
            ),
            (3, parts[1].nanos + 3, 160, 11)
        );
    }

    #[test]
    fn begin_drops_the_time_between_passes() {
        start();
        std::thread::sleep(std::time::Duration::from_millis(5));
        begin();
        mark("a");
        let parts = stop();
        assert!(parts[0].nanos < 5_000_000, "{parts:?}");
    }
}
