import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `flock` locks taken with a limit on the wait, and who holds one when the wait runs out.
///
/// A blocking `flock` waits for as long as the holder keeps the lock, and a process stopped while it holds one (by
/// SIGSTOP, a debugger, a frozen cgroup) keeps it for as long as it is stopped: every writer of that file would wait
/// with it. So no lock of the package is waited for without a limit: the lock is tried without blocking, and while
/// someone holds it, tried again after pauses that grow from 10 µs to 1 ms, until the limit (or three times it, while
/// the holder the kernel names runs: contended writers make progress). Uncontended, that is the one system call a
/// blocking `flock` was; the holders of these locks hold them for one write, so the first retry nearly always finds
/// it free.
extension Descriptor {
    /// The first pause before the lock is tried again, and the longest.
    private static let firstPause = Duration.microseconds(10)
    private static let longestPause = Duration.milliseconds(1)

    /// Takes the `flock` lock (shared for readers, exclusive for writers), waiting at most `limit` for its holder;
    /// false when the limit ran out first, or the process was suspended while it waited (no lock is taken then).
    ///
    /// `flock` locks belong to the open file description, so two descriptors in one process exclude each other
    /// just as two processes do, unlike POSIX record locks; threads sharing one description do not.
    package func lock(exclusive: Bool, waitingAtMost limit: Duration) -> Result<Bool, Errno> {
        let operation = (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB
        // The clock is read only once the lock was found held: uncontended, the call is the one `flock`.
        var deadline: ContinuousClock.Instant?
        var extensions = 0
        var pause = Self.firstPause
        while true {
            if flock(rawValue, operation) == 0 { return .success(true) }
            let error = currentErrno
            guard error == .resourceTemporarilyUnavailable || error == .interrupted else { return .failure(error) }
            // A wait that began before the process was suspended takes no lock after (``SuspensionGate``).
            if SuspensionGate.isSuspended { return .success(false) }
            let now = ContinuousClock.now
            var end = deadline ?? now + limit
            if now >= end {
                // Tries that poll lose races a blocking waiter would have won: while the kernel says the lock is
                // held by a process that runs (others writing, one after the other), the wait goes on, up to three
                // times the limit. A holder that is stopped, or that nobody can name, ends it.
                guard extensions < 2, Self.holderRuns(of: self) else { return .success(false) }
                extensions += 1
                end = now + limit
            }
            deadline = end
            Self.sleep(min(pause, end - now))
            pause = min(pause * 2, Self.longestPause)
        }
    }

    /// Takes the `flock` lock as ``lock(exclusive:waitingAtMost:)`` does, or throws what each call site would:
    /// ``WormholeError/Code/timedOut`` naming the holder when the wait ran out, the file system's error otherwise.
    package func lock(
        exclusive: Bool,
        waitingAtMost limit: Duration,
        toDo what: String,
        identifier: String? = nil,
        path: String
    ) throws(WormholeError) {
        switch lock(exclusive: exclusive, waitingAtMost: limit) {
        case .success(true): return
        case .success(false) where SuspensionGate.isSuspended:
            throw .suspended(what, identifier: identifier, path: path)
        case .success(false):
            throw .lockWaitExpired(what, limit: limit, descriptor: self, identifier: identifier, path: path)
        case .failure(let errno):
            throw .fileSystem(errno, what, identifier: identifier, path: path)
        }
    }

    /// Whether the kernel names a holder of the file's lock that is not stopped (Linux only).
    private static func holderRuns(of descriptor: Descriptor) -> Bool {
        guard case .success(let status) = descriptor.status(),
            let holder = LockHolder.of(device: status.device, inode: status.inode)
        else { return false }
        return !holder.isStopped
    }

    private static func sleep(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
        var remaining = timespec()
        // Interrupted: the lock is tried again sooner, which does no harm.
        _ = nanosleep(&request, &remaining)
    }
}

/// The process that holds a file's lock, as the kernel tells it, for the error of a wait that ran out.
package struct LockHolder: Sendable, Equatable, CustomStringConvertible {
    /// Its process id.
    package var processID: Int32
    /// Its command name (`/proc/PID/comm`), when it could be read.
    package var name: String?
    /// Whether it is stopped (by a signal or a debugger, `T` or `t` in `/proc/PID/stat`).
    package var isStopped: Bool

    package var description: String {
        "process \(processID)" + (name.map { " (\($0))" } ?? "") + (isStopped ? ", which is stopped," : "")
    }

    /// The holder of a `flock` or POSIX lock on the file with this device and inode, from `/proc/locks`; nil where
    /// the kernel does not tell (not Linux) or nobody holds one now.
    package static func of(device: UInt64, inode: UInt64) -> LockHolder? {
        #if os(Linux) || os(Android)
        guard let text = try? String(contentsOfFile: "/proc/locks", encoding: .utf8) else { return nil }
        // `1: FLOCK  ADVISORY  WRITE 2893 fd:01:1316 0 EOF`; the device's major and minor are in hexadecimal,
        // the inode in decimal. A line with `->` is a waiter, not a holder.
        // As glibc's `major()` and `minor()`.
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & 0xffff_f000)
        let minor = (device & 0xff) | ((device >> 12) & 0xffff_ff00)
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, !fields.contains("->") else { continue }
            let place = fields[5].split(separator: ":")
            guard place.count == 3, UInt64(place[0], radix: 16) == major, UInt64(place[1], radix: 16) == minor,
                UInt64(place[2]) == inode, let processID = Int32(fields[4]), processID > 0
            else { continue }
            return LockHolder(processID: processID, name: commandName(processID), isStopped: isStopped(processID))
        }
        return nil
        #else
        return nil
        #endif
    }

    #if os(Linux) || os(Android)
    private static func commandName(_ processID: Int32) -> String? {
        (try? String(contentsOfFile: "/proc/\(processID)/comm", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private static func isStopped(_ processID: Int32) -> Bool {
        // `PID (COMM) STATE …`: the state follows the last `)`, since the name may hold anything.
        guard let text = try? String(contentsOfFile: "/proc/\(processID)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return false }
        let state = text[text.index(after: close)...].drop { $0 == " " }.first
        return state == "T" || state == "t"
    }
    #endif
}

extension WormholeError {
    /// The error of a lock wait that ran out: what was not done, who holds the lock, and what to do.
    static func lockWaitExpired(
        _ what: String,
        limit: Duration,
        descriptor: Descriptor,
        identifier: String? = nil,
        path: String
    ) -> WormholeError {
        var holder: LockHolder?
        if case .success(let status) = descriptor.status() {
            holder = LockHolder.of(device: status.device, inode: status.inode)
        }
        let who = holder.map { "\($0) holds it" } ?? "another process holds it"
        return WormholeError(
            .timedOut,
            "Waited \(limit) or more to \(what): \(who). Nothing was written. Try again later; a process that stays stopped "
                + "holds everyone up, so resume it (SIGCONT) or end it. The wait's limit is "
                + "FileTransiting.Options.lockWaitLimit.",
            identifier: identifier,
            path: path
        )
    }
}
