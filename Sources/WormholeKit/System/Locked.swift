#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A value that threads take turns with, behind a `pthread_mutex`.
///
/// It does what `Synchronization.Mutex` does, with one difference that matters here: ThreadSanitizer sees a
/// `pthread_mutex`, and on Linux it does not see `Mutex`, whose futex calls it reports as races. Every lock of
/// this package is a `Locked`, so that `scripts/sanitize thread` reports only real races.
///
/// `withLock` is `@inlinable`, for code that other modules specialise (``ListeningChannel``): a lock taken per element
/// costs no call there.
@usableFromInline
package final class Locked<Value>: @unchecked Sendable {
    @usableFromInline
    let mutex: UnsafeMutablePointer<pthread_mutex_t>
    /// The value, out of line: the lock makes access exclusive, and a stored property would have every access checked
    /// again at run time (exclusivity enforcement), on paths taken per message.
    @usableFromInline
    let value: UnsafeMutablePointer<Value>

    package init(_ value: Value) {
        self.value = .allocate(capacity: 1)
        self.value.initialize(to: value)
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
        value.deinitialize(count: 1)
        value.deallocate()
    }

    /// Runs `body` with the value, holding the lock; `body` must not take this lock again.
    @inlinable
    package func withLock<Result, Failure: Error>(
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value.pointee)
    }
}
