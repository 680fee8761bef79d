//! The bench's allocator: the system's, counting the bytes in use, so that what holding leases
//! costs is read apart from what the allocator keeps around it (`held`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// The system allocator, counting.
pub struct Counting;

/// Bytes allocated and not freed.
static IN_USE: AtomicI64 = AtomicI64::new(0);

/// Bytes allocated and not freed, by the program (not the allocator's own overhead).
pub fn in_use() -> i64 {
    IN_USE.load(Relaxed)
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size() as i64, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size() as i64, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size() as i64, Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on unchanged.
        let q = unsafe { System.realloc(p, layout, size) };
        if !q.is_null() {
            IN_USE.fetch_add(size as i64 - layout.size() as i64, Relaxed);
        }
        q
    }
}
