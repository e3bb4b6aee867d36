//! The process's allocator: mimalloc, asked through its plain entry points whenever a
//! layout's alignment is one every mimalloc block has anyway; and the process-wide memory
//! calls the dataplane's binary makes: [`trim_heap`] (or [`trim_system_heap`] with glibc's
//! malloc) and [`no_transparent_huge_pages`].
//!
//! The `mimalloc` crate's allocator passes every layout to `mi_malloc_aligned`. In mimalloc
//! 3 that call takes its fast path only for a block of at most 1 KiB whose size class has a
//! free block at hand; any other request (a larger block, or a size class whose page ran
//! empty) goes to the generic aligned path, which for a size class that is not a power of
//! two over-allocates `size + alignment - 1` from the next class up: ~300 instructions
//! instead of ~20, and a larger block. callgrind counted 7 such allocations of every new
//! connection's 24 (hyper's buffers, the connection's task and boxed futures). `mi_malloc`
//! takes the regular path for them.
//!
//! The rule is the one std's `System` allocator uses for `malloc`: an alignment of at most
//! 16 bytes (`MI_MAX_ALIGN_SIZE`) and at most the size. mimalloc aligns every block of 16
//! bytes or more to 16 (it is a `malloc` for C's `max_align_t`) and every smaller block to
//! 8, so such a block always has the alignment asked for.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment mimalloc gives every block of at least this size (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// Whether a block of `size` bytes from mimalloc's plain entry points is aligned to `align`.
#[inline(always)]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

/// mimalloc as the global allocator (`#[global_allocator]` in the dataplane's binary).
pub struct Mimalloc;

#[allow(unsafe_code)]
// SAFETY: every method hands mimalloc a request it serves with a block of at least the
// layout's size and alignment (its plain calls only where `plain` holds, see the module's
// comment; its aligned calls otherwise), frees only what it allocated (`mi_free` takes a
// block from any of these calls), and returns null on failure as `GlobalAlloc` expects.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation calls have no preconditions.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract), i.e. from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract); the
        // block returned has `new_size` bytes at the layout's alignment (see `alloc`).
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// Turns transparent huge pages off for this process. mimalloc asked for them on its arenas
/// (`madvise(MADV_HUGEPAGE)`; its `no_thp` build feature now stops that, which matters
/// where the host's THP mode is `madvise`, the default), and the kernel's khugepaged then
/// filled every 2 MiB range
/// that still holds a live allocation back up to a whole huge page: after connections
/// close or park and their buffers go back to the OS, resident memory climbed again by
/// about 9 MiB every 10 s (khugepaged's scan period). Measured with 9,000 parked keep-alive
/// connections: 64 MiB and rising after 30 s with huge pages, 24 MiB and flat without
/// (issue 21; nginx holds 21 MiB). A proxy's heap is small and its accesses scattered, so
/// huge pages buy it little. The idle process's anonymous memory (no connection yet) went
/// from 5.9 MiB (2 MiB of it one huge page taken before this call) to 1.3 MiB once mimalloc
/// stopped asking for them. On a host whose THP mode is `always` a range touched before
/// this call may still be a huge page.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn no_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes nothing but this
    // process's huge-page policy; it fails (harmlessly) on kernels without it.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Turns transparent huge pages off for this process: nothing to do off Linux.
#[cfg(not(target_os = "linux"))]
pub fn no_transparent_huge_pages() -> std::io::Result<()> {
    Ok(())
}

/// Returns memory freed by this thread to the OS. mimalloc otherwise keeps the pages of a
/// reload's transient parse trees until the thread allocates again, which an idle reload
/// thread never does: measured with 10k routes, 96 MiB resident instead of about 30 MiB.
/// Workers call it too once connections closed (the dataplane's `server::set_idle_trim`).
#[allow(unsafe_code)]
pub fn trim_heap() {
    // SAFETY: `mi_collect` has no preconditions; it only releases memory mimalloc owns and
    // that no live allocation uses.
    unsafe { mi::mi_collect(true) }
}

/// With glibc's malloc as the global allocator (the dataplane's `system-allocator`
/// feature): gives the free memory at the top of the heap and in whole free pages back to
/// the OS.
#[cfg(target_env = "gnu")]
#[allow(unsafe_code)]
pub fn trim_system_heap() {
    // SAFETY: `malloc_trim` has no preconditions; it only releases memory malloc owns and
    // that no live allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
#[allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Every block has its layout's alignment and size, whichever entry point served it,
    /// through growth and shrinking, and is freed without complaint; many blocks of a size
    /// are live at once so that size classes run their pages empty (the path that used to
    /// over-allocate).
    #[test]
    fn every_block_has_the_alignment_and_size_asked_for() {
        let a = Mimalloc;
        let sizes = (1..=64)
            .chain((72..=1100).step_by(8))
            .chain([1536, 2000, 4096, 5000, 8192, 16_384, 65_536, 100_000]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                let layout = layout.pad_to_align();
                let mut live = Vec::new();
                let count = if size > 4096 { 4 } else { 40 };
                for i in 0..count {
                    // SAFETY: a non-zero size; the block is freed below with this layout.
                    let p = unsafe {
                        if i % 2 == 0 {
                            a.alloc(layout)
                        } else {
                            a.alloc_zeroed(layout)
                        }
                    };
                    assert!(!p.is_null(), "{layout:?}");
                    assert_eq!(p as usize % align, 0, "{layout:?}");
                    if i % 2 == 1 {
                        // SAFETY: `p` holds `layout.size()` bytes.
                        let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
                        assert!(bytes.iter().all(|b| *b == 0), "{layout:?} not zeroed");
                    }
                    // SAFETY: `p` holds `layout.size()` bytes.
                    unsafe { p.write_bytes(0xA5, layout.size()) };
                    live.push(p);
                }
                for (i, p) in live.into_iter().enumerate() {
                    let new_size = if i % 2 == 0 {
                        layout.size() * 3
                    } else {
                        layout.size().div_ceil(2)
                    };
                    let new_size = new_size.next_multiple_of(align);
                    // SAFETY: `p` came from `alloc` with `layout`; `new_size` is non-zero.
                    let q = unsafe { a.realloc(p, layout, new_size) };
                    assert!(!q.is_null(), "{layout:?} -> {new_size}");
                    assert_eq!(q as usize % align, 0, "{layout:?} -> {new_size}");
                    let kept = layout.size().min(new_size);
                    // SAFETY: `q` holds at least `kept` bytes, the old block's first bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(q, kept) };
                    assert!(bytes.iter().all(|b| *b == 0xA5), "{layout:?} -> {new_size}");
                    let new_layout = Layout::from_size_align(new_size, align).unwrap();
                    // SAFETY: `q` came from `realloc` to `new_layout`.
                    unsafe { a.dealloc(q, new_layout) };
                }
            }
        }
    }

    /// A block of a size class's exact size is taken from that class, not over-allocated
    /// from the next one up (what `mi_malloc_aligned` does for classes above 1 KiB that are
    /// not powers of two: 1,280 bytes came from the 1,536-byte class).
    #[test]
    fn a_block_comes_from_its_own_size_class() {
        let a = Mimalloc;
        let mut checked = 0;
        for size in (1032..=32_768).step_by(8) {
            // SAFETY: `mi_good_size` has no preconditions.
            let class = unsafe { mi::mi_good_size(size) };
            if class != size || size.is_power_of_two() {
                continue;
            }
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a non-zero size; freed below with this layout.
            let p = unsafe { a.alloc(layout) };
            assert!(!p.is_null());
            // SAFETY: `p` is a live mimalloc block.
            let usable = unsafe { mi::mi_usable_size(p.cast::<c_void>()) };
            // SAFETY: `p` came from `alloc` with `layout`.
            unsafe { a.dealloc(p, layout) };
            assert_eq!(usable, size, "a {size}-byte block");
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} size classes checked");
    }

    /// The process-wide calls the binary makes at start and when a worker idles succeed,
    /// and huge pages are off for the process afterwards (where the kernel reports it).
    #[test]
    fn huge_pages_go_off_and_the_heap_is_trimmed() {
        no_transparent_huge_pages().unwrap();
        trim_heap();
        #[cfg(target_env = "gnu")]
        trim_system_heap();
        #[cfg(target_os = "linux")]
        {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            // NB: `THP_enabled` is in the status since Linux 5.0.
            if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
                assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
            }
        }
    }

    #[test]
    fn the_plain_calls_are_for_alignments_every_block_has() {
        assert!(plain(8, 8));
        assert!(plain(16, 16));
        assert!(plain(16, 4096));
        assert!(plain(1, 1));
        assert!(!plain(16, 8), "an 8-byte block is only 8-aligned");
        assert!(!plain(32, 64));
        assert!(!plain(128, 4096));
    }
}
