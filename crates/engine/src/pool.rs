//! A persistent thread pool with a low-latency hand-off.
//!
//! A decode step of a small model is a few hundred microseconds made of a few hundred matmuls,
//! so waking threads per operation must cost next to nothing. Workers stay alive for the pool's
//! life; between jobs they spin on a generation counter for a short while (a hand-off then costs
//! a cache-line transfer each way, well under a microsecond: the caller's line to start the
//! job, each worker's own line to say it finished) and only then sleep on a condition variable.
//!
//! A job is a function of the worker index `0..n`; the caller runs index 0 itself and returns when
//! every index has run. The split of work over indices is the caller's, fixed by the index alone,
//! so results never depend on which OS thread ran what (D1).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// With more threads than cores (`-t 64` on a 16-core machine), how long a waiting thread
/// spins before it yields between checks, so that it hands its core to a thread that still
/// has work instead of burning its time slice. With a core each, waits only spin: a yield
/// there made two-thread decode slower and less even.
const SPIN_ALONE: Duration = Duration::from_micros(50);

/// How long the caller waits on the workers before it yields, whatever the thread count: a
/// job's shares are even, so a worker this far behind has lost its core to another process
/// (or to a server's own threads), and spinning on would burn the time slice it needs.
const BEHIND: Duration = Duration::from_micros(100);

/// One step of a wait that began at `since`: a pause, or a yield once an oversubscribed
/// pool's thread has spun alone long enough.
fn wait_step(since: Instant, oversubscribed: bool) {
    if oversubscribed && since.elapsed() >= SPIN_ALONE {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

type Job = dyn Fn(usize) + Sync;

/// What the threads share, what `run` writes apart from what each worker writes, a cache line
/// (pair) each, so that no write takes a line another core spins on unless it is news to it.
#[repr(C)]
struct Shared {
    /// More threads than this process has CPUs: waits yield (see [`wait_step`]).
    oversubscribed: bool,
    /// Written by `run` to start a job, read by the spinning workers.
    start: Lines<Start>,
    /// Per worker, the last generation it finished: `run` waits for every one to reach the
    /// current. Flags of their own, not one shared count: with a count, the workers' decrements
    /// take the line in turn (a transfer each, at every hand-off), where each flag is written
    /// by its worker alone and `run` reads them all at once.
    done: Box<[Lines<AtomicU64>]>,
    /// Set when a job panicked on a worker; `run` re-raises it on the caller.
    panicked: AtomicBool,
    /// Workers asleep on `wake` (or about to be): `run` takes the lock and notifies only then,
    /// so a hand-off to spinning workers costs no system call.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// `T` alone on an aligned pair of cache lines (the unit x86 cores prefetch lines in).
#[repr(align(128))]
struct Lines<T>(T);

impl<T> std::ops::Deref for Lines<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Start {
    /// The current job: a pointer to `run`'s `&Job` (a thin pointer to the fat one, so that it
    /// fits an atomic), stored before `generation` is bumped. Workers read it only after they
    /// see a new generation, while `run` waits for them. An atomic rather than a lock: every
    /// worker reads it at every hand-off, and behind a mutex their reads would take turns.
    job: AtomicPtr<&'static Job>,
    generation: AtomicU64,
    shutdown: AtomicBool,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` callers (the pool runs one job at a time).
    running: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n` threads in all: the caller and `n - 1` workers.
    pub fn new(n: usize) -> ThreadPool {
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        let shared = Arc::new(Shared {
            oversubscribed: n > cpus,
            start: Lines(Start {
                job: AtomicPtr::new(std::ptr::null_mut()),
                generation: AtomicU64::new(0),
                shutdown: AtomicBool::new(false),
            }),
            done: (1..n.max(1)).map(|_| Lines(AtomicU64::new(0))).collect(),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("synapse-{i}"))
                    .spawn(move || worker(&shared, i))
                    .expect("spawn a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    /// Threads in the pool, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f(i)` for every `i` in `0..n_threads()`, `f(0)` on the calling thread; return when all
    /// have finished.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            return f(0);
        }
        let _one_at_a_time = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // Erase the job's lifetime to share it with the workers.
        let job: &'static Job =
            // SAFETY: only the lifetime changes; every worker has finished with it before this
            // function returns, and none reads it again before the next `run` stores another.
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f) };
        // A pointer to `job` on this frame, which outlives every worker's use of it (as above).
        s.start
            .job
            .store((&job as *const &'static Job).cast_mut(), Ordering::Release);
        // SeqCst pairs with the worker's `sleepers` increment and generation check: either it
        // sees this generation and does not sleep, or this sees it counted and wakes it.
        let generation = s.start.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // The workers borrow `f` until they finish: even if our share panics, wait for them
        // before unwinding out of this frame.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0)));
        let since = Instant::now();
        while s
            .done
            .iter()
            .any(|d| d.load(Ordering::Acquire) != generation)
        {
            // A worker this far behind has lost its core (to another process, or to the
            // server's own threads): yield, or the wait burns the time slice it needs.
            if since.elapsed() >= BEHIND {
                std::thread::yield_now();
            } else {
                wait_step(since, s.oversubscribed);
            }
        }
        if let Err(payload) = mine {
            s.panicked.store(false, Ordering::Release);
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("a thread-pool job panicked on a worker thread");
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin first, then sleep.
        let start = Instant::now();
        loop {
            if s.start.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.start.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if start.elapsed() < SPIN {
                wait_step(start, s.oversubscribed);
                continue;
            }
            let guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            if s.start.generation.load(Ordering::SeqCst) == seen
                && !s.start.shutdown.load(Ordering::Acquire)
            {
                // Woken by `run` or `drop`; a spurious wake-up just loops.
                let _ = s.wake.wait_timeout(guard, Duration::from_millis(100));
            } else {
                drop(guard);
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        // Stored before the generation this worker saw (whose load acquired it).
        let job = s.start.job.load(Ordering::Acquire);
        if !job.is_null() {
            // A panicking job must still count as finished, or `run` would wait forever.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: `run` keeps the job, and the reference to it that `job` points to,
                // alive until every worker's `done` reaches this generation, which needs this
                // worker's store below.
                unsafe { (*job)(index) }
            }));
            if ran.is_err() {
                s.panicked.store(true, Ordering::Release);
            }
        }
        s.done[index - 1].store(seen, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.start.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The thread count the commands take unless told: one per physical core this process may
/// run on. Two SMT threads of a core share its vector units and its share of the memory
/// bandwidth (what decode is bound by), so a second thread on a core adds hand-offs and
/// contention rather than speed (llama.cpp defaults to physical cores too). Where the topology
/// cannot be read (not Linux, no sysfs) or a CPU quota allows fewer: every CPU available.
pub fn default_threads() -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[cfg(target_os = "linux")]
    {
        let allowed = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .and_then(cpu_list)
            });
        let root = std::path::Path::new("/sys/devices/system/cpu");
        if let Some(cores) = allowed.and_then(|cpus| physical_cores(root, &cpus)) {
            return cores.clamp(1, available);
        }
    }
    available
}

/// The CPUs of a kernel CPU list (`0-3,8,10-11`), `None` if it is not one.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (usize, usize) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
        if hi < lo || hi - lo > 1 << 16 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// How many cores the online CPUs of `cpus` lie on, from sysfs under `root` (`online`, and
/// `cpuN/topology/thread_siblings_list`: the CPUs that share CPU N's core); `None` if an online
/// CPU's entry cannot be read. (A process may be allowed CPUs that are not online: a VM's
/// allowed list often names every CPU it could ever have.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn physical_cores(root: &std::path::Path, cpus: &[usize]) -> Option<usize> {
    let online = std::fs::read_to_string(root.join("online"))
        .ok()
        .and_then(|s| cpu_list(&s));
    let mut cores = std::collections::HashSet::new();
    for cpu in cpus
        .iter()
        .filter(|c| online.as_ref().is_none_or(|o| o.contains(c)))
    {
        let path = root.join(format!("cpu{cpu}/topology/thread_siblings_list"));
        let siblings = cpu_list(&std::fs::read_to_string(path).ok()?)?;
        cores.insert(siblings.into_iter().min()?);
    }
    Some(cores.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_bad_ones_are_refused() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("5"), Some(vec![5]));
        for bad in ["", "a", "3-1", "1,,2", "0-"] {
            assert_eq!(cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn smt_siblings_count_as_one_core() {
        // Four CPUs on two cores (0 and 2 share one, 1 and 3 the other), as Linux numbers them.
        let root = tempfile::tempdir().unwrap();
        for (cpu, siblings) in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")] {
            let dir = root.path().join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("thread_siblings_list"), format!("{siblings}\n")).unwrap();
        }
        assert_eq!(physical_cores(root.path(), &[0, 1, 2, 3]), Some(2));
        assert_eq!(physical_cores(root.path(), &[0, 2]), Some(1));
        assert_eq!(physical_cores(root.path(), &[0, 1]), Some(2));
        // A CPU without an entry: unknown, not guessed.
        assert_eq!(physical_cores(root.path(), &[0, 4]), None);
        // Unless it is not online.
        std::fs::write(root.path().join("online"), "0-3\n").unwrap();
        assert_eq!(physical_cores(root.path(), &[0, 4, 5, 6]), Some(1));
        let n = default_threads();
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!((1..=available).contains(&n), "{n} of {available}");
    }

    #[test]
    fn every_index_runs_once_per_job() {
        let pool = ThreadPool::new(4);
        let hits: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        for round in 1..=1000 {
            pool.run(&|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), round);
            }
            if round % 250 == 0 {
                // Let the workers fall asleep and check they wake.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    #[test]
    fn every_worker_runs_the_job_of_its_round() {
        // More threads than this machine may have cores, and each job a closure over a local
        // of its own round: a worker that called a stale job would leave an old round behind.
        let pool = ThreadPool::new(8);
        let seen: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
        for round in 1..=2000usize {
            let tag = round * 3;
            pool.run(&|i| seen[i].store(tag, Ordering::Relaxed));
            assert!(
                seen.iter().all(|s| s.load(Ordering::Relaxed) == tag),
                "round {round}"
            );
        }
    }

    #[test]
    fn a_panic_on_a_worker_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        for failing in [0, 1] {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(&|i| {
                    if i == failing {
                        panic!("job failure");
                    }
                })
            }));
            assert!(r.is_err(), "index {failing}");
        }
        let n = AtomicUsize::new(0);
        pool.run(&|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn one_thread_runs_inline() {
        let pool = ThreadPool::new(1);
        let n = AtomicUsize::new(0);
        pool.run(&|i| {
            assert_eq!(i, 0);
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 1);
    }
}
