//! Asking the CPU for memory before it is read, where the hardware prefetcher cannot guess
//! the addresses: hash-table probes, or a trace's rows read in time order when its events
//! are stored shuffled.

/// Asks the CPU to load the cache line at `at` without waiting for it.
#[inline]
pub(crate) fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault; `at` is a valid
    // reference anyway.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((at as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Asks for every cache line of `values`.
#[inline]
pub(crate) fn prefetch_all<T>(values: &[T]) {
    const LINE: usize = 64;
    for value in values.iter().step_by((LINE / size_of::<T>()).max(1)) {
        prefetch(value);
    }
    if let Some(last) = values.last() {
        prefetch(last);
    }
}
