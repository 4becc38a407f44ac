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
