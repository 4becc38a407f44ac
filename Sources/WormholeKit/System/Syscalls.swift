import CWormholeSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Runs a system call that reports failure as -1 and `errno`, retrying on `EINTR` unless told not to.
///
/// As in swift-system: every call that can block is retried when a signal interrupts it.
@inline(__always)
func valueOrErrno<I: FixedWidthInteger>(retryOnInterrupt: Bool = true, _ body: () -> I) -> Result<I, Errno> {
    while true {
        let result = body()
        if result != -1 { return .success(result) }
        let error = Errno(rawValue: errno)
        if retryOnInterrupt && error == .interrupted { continue }
        return .failure(error)
    }
}

/// The errno of the last failed call, as a typed value.
var currentErrno: Errno { Errno(rawValue: errno) }

/// File-type and ownership facts read with `fstat`, the few a wormhole checks.
struct FileStatus: Sendable {
    var size: Int
    var linkCount: Int
    var ownerID: UInt32
    var mode: UInt32
    /// The last modification, in seconds since 1970.
    var modificationTime: Double
    /// The device that holds the file.
    var device: UInt64
    /// The file's inode number on its device: with ``device``, which file this is.
    var inode: UInt64

    var isRegularFile: Bool { mode & UInt32(S_IFMT) == UInt32(S_IFREG) }

    init(_ raw: stat) {
        // Clamped: on watchOS `Int` has 32 bits, and a file past 2 GiB must not trap (no file a wormhole reads by
        // its size is that large; a log's offsets are 64-bit).
        size = Int(clamping: raw.st_size)
        linkCount = Int(raw.st_nlink)
        ownerID = UInt32(raw.st_uid)
        mode = UInt32(raw.st_mode)
        #if canImport(Darwin)
        let time = raw.st_mtimespec
        #else
        let time = raw.st_mtim
        #endif
        modificationTime = Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
        #if canImport(Darwin)
        device = UInt64(UInt32(bitPattern: raw.st_dev))  // `dev_t` is a signed 32-bit integer on Darwin
        #else
        device = UInt64(raw.st_dev)
        #endif
        inode = UInt64(raw.st_ino)
    }
}

/// A file descriptor that this code owns: it is closed exactly once, when the value goes away.
///
/// Being `~Copyable`, a descriptor can be neither leaked by a copy nor closed twice. Its operations live on
/// ``Descriptor``, the non-owning view that ``descriptor`` gives.
package struct OwnedDescriptor: ~Copyable {
    let rawValue: Int32

    init(taking rawValue: Int32) { self.rawValue = rawValue }

    deinit { _ = Glibc_closeDescriptor(rawValue) }

    /// Gives up ownership without closing.
    consuming func release() -> Int32 {
        let value = rawValue
        discard self
        return value
    }

    /// The descriptor's operations; valid while this value lives.
    package var descriptor: Descriptor { Descriptor(rawValue: rawValue) }
}

/// The operations on an open descriptor, without ownership: whoever made it closes it.
package struct Descriptor {
    let rawValue: Int32

    /// swift-system's descriptor, for the calls it wraps (reads, writes, closing); the others are here.
    private var file: FileDescriptor { FileDescriptor(rawValue: rawValue) }

    func status() -> Result<FileStatus, Errno> {
        var raw = stat()
        return valueOrErrno { fstat(rawValue, &raw) }.map { _ in FileStatus(raw) }
    }

    /// Reads up to `count` bytes at `offset`, looping over short reads; fewer bytes mean the end of the file.
    func read(count: Int, at offset: Int) -> Result<[UInt8], Errno> {
        var failure: Errno?
        let buffer = [UInt8](unsafeUninitializedCapacity: count) { bytes, initialized in
            switch read(filling: UnsafeMutableRawBufferPointer(bytes), at: offset) {
            case .success(let done): initialized = done
            case .failure(let error):
                failure = error
                initialized = 0
            }
        }
        if let failure { return .failure(failure) }
        return .success(buffer)
    }

    /// Reads into `buffer` from `offset`, looping over short reads; returns how many bytes were read, fewer than
    /// `buffer.count` only at the end of the file.
    func read(filling buffer: UnsafeMutableRawBufferPointer, at offset: Int) -> Result<Int, Errno> {
        var done = 0
        while done < buffer.count {
            let rest = UnsafeMutableRawBufferPointer(rebasing: buffer[done...])
            switch errnoResult({ try file.read(fromAbsoluteOffset: Int64(offset + done), into: rest) }) {
            case .success(0): return .success(done)
            case .success(let n): done += n
            case .failure(let error): return .failure(error)
            }
        }
        return .success(done)
    }

    /// Writes all of `bytes` at `offset`, looping over short writes.
    func write(_ bytes: [UInt8], at offset: Int) -> Result<Void, Errno> {
        bytes.withUnsafeBytes { write($0, at: offset) }
    }

    /// Writes all of `bytes` at `offset`, looping over short writes.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> Result<Void, Errno> {
        var done = 0
        while done < bytes.count {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[done...])
            switch errnoResult({ try file.write(toAbsoluteOffset: Int64(offset + done), rest) }) {
            case .success(let n): done += n
            case .failure(let error): return .failure(error)
            }
        }
        return .success(())
    }

    /// Opens a file by path (close-on-exec), for a file outside any wormhole directory, such as one to send; a file
    /// it creates gets `permissions`.
    package static func open(
        path: String,
        flags: Int32,
        permissions: mode_t = 0o600
    ) -> Result<OwnedDescriptor, Errno> {
        valueOrErrno { Glibc_openPath(path, flags | O_CLOEXEC, permissions) }.map { OwnedDescriptor(taking: $0) }
    }

    /// Reads up to `buffer.count` bytes at the file's position; 0 at its end.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Result<Int, Errno> {
        errnoResult { try file.read(into: buffer) }
    }

    /// One `write` of all of `bytes` at the file's position (for `O_APPEND`, at its end, whole); returns how many
    /// were written, fewer only when the disk is full.
    func writeOnce(_ bytes: UnsafeRawBufferPointer) -> Result<Int, Errno> {
        errnoResult { try file.write(bytes) }
    }

    /// Reads up to `count` bytes at `offset` into `buffer` with one `pread`; fewer mean the end of the file.
    func read(into buffer: UnsafeMutableRawPointer, count: Int, at offset: UInt64) -> Result<Int, Errno> {
        errnoResult {
            try file.read(
                fromAbsoluteOffset: Int64(offset),
                into: UnsafeMutableRawBufferPointer(start: buffer, count: count)
            )
        }
    }

    /// The first offset at or after `offset` that holds data, skipping holes; nil where the file system cannot tell.
    func nextData(from offset: UInt64) -> UInt64? {
        // In C, by the platform's own SEEK_DATA (3 on Linux, 4 on Darwin), which Glibc's module does not import.
        guard offset <= UInt64(Int64.max) else { return nil }
        let data = cwormhole_seek_data(rawValue, Int64(offset))
        return data >= 0 ? UInt64(data) : nil
    }

    /// Frees the blocks of the first `length` bytes, keeping the file's size and later offsets; the range reads
    /// as zeros. Not every file system can (Linux's ext4, XFS, Btrfs and tmpfs can, Darwin's APFS can): the error
    /// says so.
    func punchHole(length: UInt64) -> Result<Void, Errno> {
        guard length <= UInt64(Int64.max) else { return .failure(.invalidArgument) }
        return valueOrErrno { cwormhole_punch_hole(rawValue, 0, Int64(length)) }.map { _ in }
    }

    /// Closes a descriptor that no `OwnedDescriptor` owns.
    func close() {
        try? file.close()
    }

    /// Flushes the file to stable storage: `fsync`, and on Darwin `F_FULLFSYNC`, without which the data may still
    /// sit in the drive's cache when the power goes.
    func synchronize() -> Result<Void, Errno> {
        valueOrErrno { cwormhole_full_sync(rawValue) }.map { _ in }
    }

    /// Takes a shared `flock` lock if no writer holds the exclusive one; false (and no lock) when one does.
    package func tryLockShared() -> Bool {
        flock(rawValue, LOCK_SH | LOCK_NB) == 0
    }

    package func unlock() {
        _ = flock(rawValue, LOCK_UN)
    }

    /// A new descriptor of the same open file (sharing its offset and its `flock` lock), closed on exec.
    package func duplicate() -> Result<Descriptor, Errno> {
        valueOrErrno { fcntl(rawValue, F_DUPFD_CLOEXEC, 0) }.map { Descriptor(rawValue: $0) }
    }

    /// Takes the exclusive `flock` lock if nobody holds the lock: true when taken, false when someone holds it.
    package func tryLockExclusive() -> Result<Bool, Errno> {
        if flock(rawValue, LOCK_EX | LOCK_NB) == 0 { return .success(true) }
        let error = currentErrno
        return error == .resourceTemporarilyUnavailable || error == .interrupted ? .success(false) : .failure(error)
    }
}

/// Flushes an open file to stable storage as ``Descriptor/synchronize()`` does (`F_FULLFSYNC` on Darwin), for the
/// engines of other modules; the error, or nil.
package func synchronizeToStableStorage(_ descriptor: Int32) -> Errno? {
    if case .failure(let errno) = Descriptor(rawValue: descriptor).synchronize() { return errno }
    return nil
}

/// Names the calling thread for `ps -L`, debuggers and tests (pthread names hold 15 characters).
func nameCurrentThread(_ name: String) {
    cwormhole_set_thread_name(name)
}

/// Process-wide facts used in file checks and envelopes.
enum ProcessFacts {
    /// Read once: a process that changes its user mid-run is not one a wormhole serves.
    static let effectiveUserID = UInt32(geteuid())
    static var processID: Int32 { getpid() }

    /// The executable's name, for the default sender of a message.
    static var processName: String {
        #if os(Linux)
        if let name = try? String(contentsOfFile: "/proc/self/comm", encoding: .utf8) {
            return name.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #endif
        return CommandLine.arguments.first.map { String($0.split(separator: "/").last ?? Substring($0)) } ?? "process"
    }

    /// Nanoseconds since 1970, from the real-time clock.
    static func wallClockNanoseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    }

    /// Nanoseconds of a monotonic clock that is cheap to read and coarse (a few milliseconds on Linux): for a check
    /// made per message that only needs to tell seconds apart. (`ContinuousClock` reads `CLOCK_BOOTTIME`, which is
    /// slower here.)
    static func coarseMonotonicNanoseconds() -> UInt64 {
        #if canImport(Darwin)
        return clock_gettime_nsec_np(CLOCK_MONOTONIC_RAW_APPROX)
        #else
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC_COARSE, &now)
        return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
        #endif
    }
}

/// A swift-system call's result, with its `Errno` typed.
@inline(__always)
func errnoResult<T>(_ body: () throws -> T) -> Result<T, Errno> {
    do {
        return .success(try body())
    } catch let errno as Errno {
        return .failure(errno)
    } catch {
        return .failure(.ioError)  // swift-system throws only Errno
    }
}

// The C calls by names that `Descriptor`'s methods do not shadow.
@inline(__always) private func Glibc_openPath(_ path: String, _ flags: Int32, _ mode: mode_t) -> Int32 {
    open(path, flags, mode)
}
@inline(__always) private func Glibc_closeDescriptor(_ descriptor: Int32) -> Int32 { close(descriptor) }
