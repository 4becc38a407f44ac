import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Calls on the directory's entries by name, for files that are not opened (socket files), and on the directory itself.
extension DirectoryHandle {
    /// The type, owner and mode of the entry `name` itself: a symbolic link is described, never followed
    /// (`fstatat` with `AT_SYMLINK_NOFOLLOW`).
    func status(ofEntry name: String) -> Result<FileStatus, Errno> {
        var raw = stat()
        return valueOrErrno { fstatat(rawDescriptor, name, &raw, AT_SYMLINK_NOFOLLOW) }.map { _ in FileStatus(raw) }
    }

    /// Whether this is the directory that `parent` holds as `name` (the same device and inode), whatever paths the
    /// two were opened by.
    func isEntry(_ name: String, of parent: DirectoryHandle) -> Bool {
        guard case .success(let mine) = Descriptor(rawValue: rawDescriptor).status(),
            case .success(let entry) = parent.status(ofEntry: name)
        else { return false }
        return mine.device == entry.device && mine.inode == entry.inode
    }

    /// Sets the mode of the entry `name` (`fchmodat`), as a socket file needs after `bind` applied the umask.
    ///
    /// A symbolic link is never followed (`AT_SYMLINK_NOFOLLOW`: the call fails on one): in a directory shared with a
    /// group, another member could put a link in the entry's place between `bind` and this call, to have a file of
    /// this user's made group-writable.
    func setMode(ofEntry name: String, to mode: mode_t) -> Result<Void, Errno> {
        valueOrErrno { fchmodat(rawDescriptor, name, mode, AT_SYMLINK_NOFOLLOW) }.map { _ in }
    }

    /// Gives the entry `name` to `group`, keeping its owner (`fchownat`); a symbolic link is never followed, for the
    /// reason ``setMode(ofEntry:to:)`` gives.
    func setGroup(ofEntry name: String, to group: gid_t) -> Result<Void, Errno> {
        valueOrErrno { fchownat(rawDescriptor, name, uid_t.max, group, AT_SYMLINK_NOFOLLOW) }.map { _ in }
    }

    /// Removes the hidden files that ``createFile(named:bytes:replacing:synchronize:)`` left behind in a process that
    /// was killed before its rename (`.tmp-PID-RANDOM`, named exactly so): those of a process that is gone and last
    /// written more than `minimumAge` seconds ago. Returns how many it removed.
    ///
    /// Both conditions, because a directory shared between containers may hold the file of a live process whose
    /// process id means nothing here, and a process id may be taken again by a new process. A file is written and
    /// renamed within milliseconds; an hour leaves room for a writer paused or stuck in `fsync` on slow storage (one
    /// paused longer would find its file gone, and its call would fail with a file-system error, nothing damaged).
    /// The user's own regular files only: another user's cannot be told apart from a planted one.
    @discardableResult
    func removeAbandonedTemporaryFiles(minimumAge: Double = 3600) -> Int {
        guard let names = try? entries() else { return 0 }
        var removed = 0
        let now = Double(ProcessFacts.wallClockNanoseconds()) / 1e9
        for name in names {
            guard let pid = Self.processOfTemporaryFile(name), kill(pid, 0) == -1, errno == ESRCH,
                case .success(let status) = status(ofEntry: name), status.isRegularFile,
                status.ownerID == ProcessFacts.effectiveUserID, now - status.modificationTime > minimumAge
            else { continue }
            if unlinkat(rawDescriptor, name, 0) == 0 { removed += 1 }
        }
        return removed
    }

    /// The process id in the name of a hidden file that ``createFile(named:bytes:replacing:synchronize:)`` writes
    /// (`.tmp-` then the id and a random `UInt64` in decimal, joined by `-`); nil for any other name.
    static func processOfTemporaryFile(_ name: String) -> pid_t? {
        guard name.hasPrefix(temporaryPrefix) else { return nil }
        let parts = name.dropFirst(temporaryPrefix.count).split(separator: "-", omittingEmptySubsequences: false)
        func isDecimal(_ part: Substring, maximumLength: Int) -> Bool {
            !part.isEmpty && part.count <= maximumLength && part.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
                && (part.count == 1 || part.first != "0")
        }
        guard parts.count == 2, isDecimal(parts[0], maximumLength: 10), isDecimal(parts[1], maximumLength: 20),
            UInt64(parts[1]) != nil, let pid = pid_t(parts[0]), pid > 0
        else { return nil }
        return pid
    }

    /// When the directory last changed (an entry came or went), in nanoseconds since 1970 (`fstat`).
    func modificationTime() -> Result<Int64, Errno> {
        var raw = stat()
        return valueOrErrno { fstat(rawDescriptor, &raw) }.map { _ in
            #if canImport(Darwin)
            let time = raw.st_mtimespec
            #else
            let time = raw.st_mtim
            #endif
            return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
        }
    }
}

extension FileStatus {
    /// Whether the file is a Unix socket.
    var isSocket: Bool { mode & UInt32(S_IFMT) == UInt32(S_IFSOCK) }
}
