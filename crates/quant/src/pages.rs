//! Memory for what the engine streams every token: the packed weights and the KV cache.
//! Anonymous memory carved, one array after the other, out of large regions that start on a
//! huge-page boundary, so that every array, the small ones too, lies in transparent huge
//! pages where the system gives them.
//!
//! Each packed matrix had its own mapping before. The kernel backs a mapping with huge pages
//! only in the 2 MiB-aligned ranges that lie wholly inside it, and a 2.4 MiB attention matrix
//! at an arbitrary page seldom contains one: much of the packed weights lay in 4 KiB pages, over
//! which a plain read runs slower (a page walk each 4 KiB, under nested paging; measurements:
//! docs/perf-log.md, "Huge pages"). A region here is one mapping of 64 MiB or more, asked for
//! huge pages once; the arrays follow each other in it, 4 KiB-aligned, so only a region's
//! unused end is left out of huge pages.
//!
//! A matrix's bytes stay writable after packing (a read-only page range inside a region would
//! split its mapping, and with it the huge pages at the split). When an array is dropped its
//! whole pages go back to the system at once; a region's mapping goes when its last array
//! does. Freed space is not reused: a region is only ever appended to.

use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};

/// A transparent huge page on x86-64 and on aarch64 with 4 KiB pages.
const HUGE: usize = 2 << 20;
/// A base page.
const PAGE: usize = 4096;
/// Bytes a region spans at least (address space; only the pages written take memory).
const REGION: usize = 64 << 20;

/// One mapping that matrices are carved out of, from its first huge-page boundary on.
struct Region {
    map: MmapRaw,
    /// Where the range asked for huge pages ends: the mapping runs up to a huge page further
    /// (the slack that let it start on a boundary), and nothing is carved out of that.
    end: usize,
}

/// The region being filled and the offset of its first free byte.
static FILLING: Mutex<Option<(Arc<Region>, usize)>> = Mutex::new(None);

/// `len` zeroed bytes, 4 KiB-aligned, in a region of huge pages (see the module's notes).
pub struct Pages {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

// SAFETY: a `Pages` owns its byte range alone (ranges never overlap, and are never handed out
// twice); shared references give only reads, writes need `&mut`.
unsafe impl Send for Pages {}
// SAFETY: as above.
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` zeroed bytes (at least one page's worth of address space).
    pub fn zeroed(len: usize) -> std::io::Result<Pages> {
        let take = len.max(1).next_multiple_of(PAGE);
        let mut filling = FILLING.lock().unwrap_or_else(|e| e.into_inner());
        let fits = filling
            .as_ref()
            .is_some_and(|(r, next)| next + take <= r.end);
        if !fits {
            // A new region: the old one's free end stays unused.
            let span = take.max(REGION).next_multiple_of(HUGE);
            let map: MmapRaw = MmapOptions::new().len(span + HUGE).map_anon()?.into();
            let start = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
            #[cfg(target_os = "linux")]
            let _ = map.advise_range(memmap2::Advice::HugePage, start, span);
            let end = start + span;
            *filling = Some((Arc::new(Region { map, end }), start));
        }
        let (region, next) = filling.as_mut().expect("a region to fill");
        let offset = *next;
        *next += take;
        Ok(Pages {
            region: region.clone(),
            offset,
            len,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset..offset + len` lies in the region's mapping, which lives as long as
        // `self` (the `Arc`), and belongs to this `Pages` alone.
        unsafe { std::slice::from_raw_parts(self.region.map.as_ptr().add(self.offset), self.len) }
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference to the range.
        unsafe {
            std::slice::from_raw_parts_mut(self.region.map.as_mut_ptr().add(self.offset), self.len)
        }
    }
}

impl std::ops::Deref for Pages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // The range's pages (whole ones: ranges start on a page and none shares one) back to
        // the system now, rather than with the region's last matrix.
        #[cfg(unix)]
        if self.len > 0 && Arc::strong_count(&self.region) > 1 {
            // SAFETY: the range is this `Pages`'s alone and no reference into it outlives
            // `self`; the pages read back as zeros if ever touched again.
            let _ = unsafe {
                self.region.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.offset,
                    self.len.next_multiple_of(PAGE),
                )
            };
        }
    }
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_zeroed_aligned_and_apart() {
        let mut a = Pages::zeroed(5000).unwrap();
        let mut b = Pages::zeroed(3).unwrap();
        let c = Pages::zeroed(0).unwrap();
        assert_eq!((a.len(), b.len(), c.len()), (5000, 3, 0));
        assert!(a.iter().chain(b.iter()).all(|&x| x == 0));
        for p in [&a, &b, &c] {
            assert_eq!(p.as_ptr() as usize % PAGE, 0);
        }
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        // Two ranges of the same region do not overlap.
        let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
        assert!(pa + a.len() <= pb || pb + b.len() <= pa);
        drop(a);
        assert!(
            b.iter().all(|&x| x == 2),
            "freeing a range left its neighbour alone"
        );
    }

    #[test]
    fn a_range_larger_than_a_region_gets_its_own() {
        // After a few small ranges (a region's start): the big one must not go into the
        // mapping's slack past the range asked for huge pages.
        let small = Pages::zeroed(5000).unwrap();
        let big = Pages::zeroed(REGION + 12345).unwrap();
        assert_eq!(big.len(), REGION + 12345);
        assert_eq!(
            big.as_ptr() as usize % HUGE,
            0,
            "a new region starts on a huge page"
        );
        assert_eq!(big[REGION + 12344], 0);
        let after = Pages::zeroed(100).unwrap();
        assert_eq!(after[99], 0);
        drop(small);
    }
}
