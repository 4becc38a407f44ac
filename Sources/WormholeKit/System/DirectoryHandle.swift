import CWormholeSystem
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An open directory that every file operation of a wormhole goes through.
///
/// Files are opened with `openat` relative to the directory's descriptor and `O_NOFOLLOW`, so a symbolic link
/// planted in the directory is never followed, and renaming the directory away does not redirect writes.
final class DirectoryHandle: Sendable {
    /// The path the directory was opened at, for messages and for inotify.
    let path: String
    /// The mode of files this handle creates.
    let filePermissions: mode_t
    /// The mode of subdirectories this handle creates.
    let directoryPermissions: mode_t
    /// The group given to what this handle creates, for a directory shared by a Unix group; nil otherwise.
    let group: gid_t?
    /// Whether files of another owner are accepted (a shared group directory), or refused as planted.
    let trustsOtherOwners: Bool
    /// Whether what this handle creates, renames and writes through the wormhole's durable paths is flushed to the
    /// disk before the call returns (``FileTransiting/Options/synchronizesWrites``): the files, and the directory
    /// entries that name them.
    let synchronizes: Bool
    private let descriptor: Int32

    private init(
        path: String,
        descriptor: Int32,
        filePermissions: mode_t,
        directoryPermissions: mode_t,
        group: gid_t?,
        trustsOtherOwners: Bool,
        synchronizes: Bool
    ) {
        self.synchronizes = synchronizes
        self.path = path
        self.descriptor = descriptor
        self.filePermissions = filePermissions
        self.directoryPermissions = directoryPermissions
        self.group = group
        self.trustsOtherOwners = trustsOtherOwners
    }

    /// Whether created files need their mode or group set after creation: the umask may have taken group bits away.
    private var setsOwnership: Bool { group != nil || filePermissions & 0o077 != 0 }

    /// Opens a directory with the modes, group and trust of a wormhole's file options.
    static func open(
        path: String,
        create: Bool,
        options: FileTransiting.Options
    ) throws(WormholeError) -> DirectoryHandle {
        try open(
            path: path,
            create: create,
            directoryPermissions: mode_t(options.directoryPermissions),
            filePermissions: mode_t(options.filePermissions),
            group: options.group.map { gid_t($0) },
            trustsOtherOwners: options.trustsOtherOwners,
            synchronizes: options.synchronizesWrites
        )
    }

    deinit { _ = close(descriptor) }

    /// Opens a directory, creating it and its missing parents with `directoryPermissions` when asked to.
    ///
    /// - Throws: ``WormholeError/Code/directoryUnavailable`` when it is missing (and not to be created), not a
    ///   directory, or not writable; ``WormholeError/Code/untrustedFile`` when it is a symbolic link or owned by
    ///   another user.
    static func open(
        path: String,
        create: Bool,
        directoryPermissions: mode_t = 0o700,
        filePermissions: mode_t = 0o600,
        group: gid_t? = nil,
        trustsOtherOwners: Bool = false,
        synchronizes: Bool = false
    ) throws(WormholeError) -> DirectoryHandle {
        guard !path.isEmpty else {
            throw WormholeError(.directoryUnavailable, "The directory path is empty.", path: path)
        }
        if create {
            try makeDirectories(path, permissions: directoryPermissions, group: group, synchronizes: synchronizes)
        }
        let descriptor: Int32
        switch valueOrErrno({ Glibc_open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }) {
        case .success(let fd): descriptor = fd
        case .failure(.noSuchFileOrDirectory):
            throw WormholeError(
                .directoryUnavailable,
                "The directory does not exist. Create it, or let the wormhole create it (the default).",
                path: path
            )
        case .failure(.notDirectory):
            throw WormholeError(
                .directoryUnavailable,
                "The path exists but is not a directory, or it is a symbolic link.",
                path: path
            )
        case .failure(.tooManySymbolicLinkLevels):
            throw WormholeError(
                .untrustedFile,
                "The directory is a symbolic link, which a wormhole never follows.",
                path: path
            )
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "open the directory", path: path)
        }
        let handle = DirectoryHandle(
            path: path,
            descriptor: descriptor,
            filePermissions: filePermissions,
            directoryPermissions: directoryPermissions,
            group: group,
            trustsOtherOwners: trustsOtherOwners,
            synchronizes: synchronizes
        )
        var raw = stat()
        guard fstat(descriptor, &raw) == 0 else {
            throw WormholeError.fileSystem(currentErrno, "inspect the directory", path: path)
        }
        let status = FileStatus(raw)
        if !trustsOtherOwners && status.ownerID != ProcessFacts.effectiveUserID {
            throw WormholeError(
                .untrustedFile,
                "The directory belongs to user \(status.ownerID), not to this process's user "
                    + "\(ProcessFacts.effectiveUserID); a private wormhole refuses it. Use a directory you own.",
                path: path
            )
        }
        if access(path, W_OK | X_OK) != 0 {
            throw WormholeError(
                .directoryUnavailable,
                "The directory is not writable by this process; check its owner and mode.",
                path: path,
                underlyingError: currentErrno
            )
        }
        return handle
    }

    /// Creates the missing directories of `path`; with `synchronizes`, each new one's parent is flushed, so that a
    /// power cut cannot take a directory away from the files later flushed in it.
    private static func makeDirectories(
        _ path: String,
        permissions: mode_t,
        group: gid_t?,
        synchronizes: Bool
    ) throws(WormholeError) {
        var prefix = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/", omittingEmptySubsequences: true) {
            prefix += "/" + component
            if mkdir(prefix, permissions & 0o777) != 0 {
                let errno = currentErrno
                if errno == .fileExists { continue }
                throw WormholeError(
                    .directoryUnavailable,
                    "Could not create the directory \(prefix): \(errno). Check that its parent exists and is writable.",
                    path: path,
                    underlyingError: errno
                )
            }
            // mkdir applied the umask and ignored the setgid bit: set the group, then the whole mode.
            if let group, chown(prefix, uid_t.max, group) != 0 {
                throw WormholeError(
                    .directoryUnavailable,
                    "Could not give \(prefix) to group \(group): \(currentErrno). This process's user must be a member "
                        + "of the group.",
                    path: path,
                    underlyingError: currentErrno
                )
            }
            if permissions & 0o7077 != 0 { _ = chmod(prefix, permissions) }
            if synchronizes {
                let parent = prefix.lastIndex(of: "/").map { String(prefix[..<$0]) }.flatMap { $0.isEmpty ? "/" : $0 }
                if let error = synchronizeDirectory(at: parent ?? ".") {
                    throw WormholeError.fileSystem(error, "flush the directory that holds \(prefix)", path: path)
                }
            }
        }
    }

    /// Flushes a directory's entries to the disk (`fsync` on the directory); the error, if it failed.
    private static func synchronizeDirectory(at path: String) -> Errno? {
        switch valueOrErrno({ Glibc_open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }) {
        case .success(let fd):
            defer { _ = close(fd) }
            if case .failure(let error) = Descriptor(rawValue: fd).synchronize() { return error }
            return nil
        case .failure(let error): return error
        }
    }

    /// Flushes the entry that names this directory in its parent, for a directory that may have been made by code
    /// that did not flush it.
    func synchronizeParentEntries() -> Result<Void, Errno> {
        let trimmed = path.hasSuffix("/") ? String(path.dropLast()) : path
        let parent = trimmed.lastIndex(of: "/").map { String(trimmed[..<$0]) }.map { $0.isEmpty ? "/" : $0 } ?? "."
        if let error = Self.synchronizeDirectory(at: parent) { return .failure(error) }
        return .success(())
    }

    /// Flushes this directory's entries (new names, renames, removals) to the disk.
    func synchronizeEntries() -> Result<Void, Errno> {
        Descriptor(rawValue: descriptor).synchronize()
    }

    /// Opens or creates a subdirectory (for the notifier's files), with the same modes, group and checks.
    func subdirectory(named name: String) throws(WormholeError) -> DirectoryHandle {
        try DirectoryHandle.open(
            path: path + "/" + name,
            create: true,
            directoryPermissions: directoryPermissions,
            filePermissions: filePermissions,
            group: group,
            trustsOtherOwners: trustsOtherOwners,
            synchronizes: synchronizes
        )
    }

    // MARK: Files

    /// Opens a file in the directory, never following a symbolic link and never blocking on a planted FIFO.
    func openFile(named name: String, flags: Int32) throws(Errno) -> OwnedDescriptor {
        let result = valueOrErrno {
            openat(descriptor, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, filePermissions)
        }
        switch result {
        case .success(let fd):
            let file = OwnedDescriptor(taking: fd)
            if flags & O_CREAT != 0 && setsOwnership { try setOwnership(of: fd) }
            return file
        case .failure(let errno): throw errno
        }
    }

    /// Creates a file if it is missing (as `touch` does), with the wormhole's mode and group.
    func touchFile(named name: String) {
        do throws(Errno) {
            let file = try openFile(named: name, flags: O_WRONLY | O_CREAT)
            _ = consume file  // closed
        } catch {
            // Watching a file that could not be created fails next, with the reason.
        }
    }

    /// Gives a file this process created the configured group and mode, whatever the umask took away. Files of
    /// other users (made by another member of a shared group) are left as they are.
    private func setOwnership(of fd: Int32) throws(Errno) {
        var raw = stat()
        guard fstat(fd, &raw) == 0 else { throw currentErrno }
        guard raw.st_uid == ProcessFacts.effectiveUserID else { return }
        if let group, raw.st_gid != group, fchown(fd, uid_t.max, group) != 0 { throw currentErrno }
        if raw.st_mode & 0o7777 != filePermissions, fchmod(fd, filePermissions) != 0 { throw currentErrno }
    }

    /// Checks that an opened file is one the wormhole may trust: a regular file with one link, owned by this
    /// user (unless the directory is shared). Returns nil when the file was unlinked (link count 0).
    func trustedStatus(
        of file: Descriptor,
        name: String,
        identifier: String?
    ) throws(WormholeError) -> FileStatus? {
        let status: FileStatus
        switch file.status() {
        case .success(let value): status = value
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "inspect \(name)", identifier: identifier, path: filePath(name))
        }
        if status.linkCount == 0 { return nil }
        guard status.isRegularFile else {
            throw WormholeError(
                .untrustedFile,
                "\(name) is not a regular file; remove it from the wormhole directory.",
                identifier: identifier,
                path: filePath(name)
            )
        }
        guard status.linkCount == 1 else {
            throw WormholeError(
                .untrustedFile,
                "\(name) has \(status.linkCount) hard links; a wormhole never writes through a link. Remove it.",
                identifier: identifier,
                path: filePath(name)
            )
        }
        if !trustsOtherOwners && status.ownerID != ProcessFacts.effectiveUserID {
            throw WormholeError(
                .untrustedFile,
                "\(name) belongs to user \(status.ownerID), not to \(ProcessFacts.effectiveUserID): it was planted. "
                    + "Remove it.",
                identifier: identifier,
                path: filePath(name)
            )
        }
        return status
    }

    /// The start of the hidden files ``createFile(named:bytes:replacing:synchronize:)`` writes, followed by the process
    /// id and a random number.
    static let temporaryPrefix = ".tmp-"

    /// Writes `bytes` to a new hidden file and renames it to `name`: readers see the old file or the new one.
    ///
    /// The file's bytes are flushed before the rename, whatever `synchronize` says: otherwise a power cut could
    /// leave the new name on an empty file, the old one gone (the rename reaches the disk in the journal, the bytes
    /// later). It costs one `fsync` on this path, taken only when a file is made or outgrows its slots. With
    /// `synchronize`, the directory is flushed after the rename too, so that the new name itself survives.
    ///
    /// With `replacing: false` the rename fails with `EEXIST` when `name` exists, so two processes that create
    /// the same file at once do not overwrite each other.
    func createFile(
        named name: String,
        bytes: [UInt8],
        replacing: Bool,
        synchronize: Bool
    ) -> Result<Void, Errno> {
        let temporary = "\(Self.temporaryPrefix)\(ProcessFacts.processID)-\(UInt64.random(in: 0...UInt64.max))"
        let file: OwnedDescriptor
        do { file = try openFile(named: temporary, flags: O_WRONLY | O_CREAT | O_EXCL) } catch {
            return .failure(error)
        }
        var result = file.descriptor.write(bytes, at: 0)
        // Creating the file applied the umask; set the mode the wormhole was configured with.
        let raw = file.rawValue
        if case .success = result { result = valueOrErrno { fchmod(raw, filePermissions) }.map { _ in } }
        if case .success = result, let group { result = valueOrErrno { fchown(raw, uid_t.max, group) }.map { _ in } }
        if case .success = result { result = file.descriptor.synchronize() }
        _ = consume file
        if case .success = result { result = rename(temporary, to: name, replacing: replacing) }
        if case .failure = result { _ = unlinkat(descriptor, temporary, 0) }
        if case .success = result, synchronize { result = synchronizeEntries() }
        return result
    }

    private func rename(_ from: String, to: String, replacing: Bool) -> Result<Void, Errno> {
        if replacing { return valueOrErrno { renameat(descriptor, from, descriptor, to) }.map { _ in } }
        return moveEntryWithoutReplacing(from, to: self, as: to)
    }

    /// Renames the entry `name` of this directory to `newName` in `target` (which may be this directory) unless
    /// `newName` exists there, which fails with `EEXIST`: a move that never replaces a file (`renameat2` with
    /// `RENAME_NOREPLACE` on Linux, `renameatx_np` with `RENAME_EXCL` on Darwin). Where the kernel or the file system
    /// has neither, a hard link then the removal of the old name, which a reader may see with two links for a
    /// moment. EXDEV means another file system.
    func moveEntryWithoutReplacing(
        _ name: String,
        to target: DirectoryHandle,
        as newName: String
    ) -> Result<Void, Errno> {
        let result = valueOrErrno { cwormhole_rename_noreplace(descriptor, name, target.descriptor, newName) }
        if case .failure(let errno) = result,
            errno == .invalidArgument || errno == .noFunction
                || errno == .notSupported
        {
            return linkThenUnlink(name, to: target, as: newName)
        }
        return result.map { _ in }
    }

    /// The portable no-replace rename, for file systems without `renameat2`.
    private func linkThenUnlink(_ name: String, to target: DirectoryHandle, as newName: String) -> Result<Void, Errno> {
        valueOrErrno { linkat(descriptor, name, target.descriptor, newName, 0) }.map { _ in
            _ = unlinkat(descriptor, name, 0)
        }
    }

    func removeFile(named name: String) -> Result<Void, Errno> {
        valueOrErrno { unlinkat(descriptor, name, 0) }.map { _ in }
    }

    /// Whether the directory has an entry `name` (of any kind; a symbolic link is not followed).
    func hasEntry(_ name: String) -> Bool {
        faccessat(descriptor, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0
    }

    /// Renames the entry `name` of this directory, replacing nothing it must not: `newName` in `target` (which may
    /// be this directory). EXDEV means another file system.
    func moveEntry(_ name: String, to target: DirectoryHandle, as newName: String) -> Result<Void, Errno> {
        valueOrErrno { renameat(descriptor, name, target.descriptor, newName) }.map { _ in }
    }

    /// The names in the directory, without `.` and `..`.
    func entries() throws(WormholeError) -> [String] {
        let copy = dup(descriptor)
        guard copy >= 0, let stream = fdopendir(copy) else {
            if copy >= 0 { _ = close(copy) }
            throw WormholeError.fileSystem(currentErrno, "list the directory", path: path)
        }
        defer { closedir(stream) }
        rewinddir(stream)
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: Int(NAME_MAX) + 1) { String(cString: $0) }
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    func filePath(_ name: String) -> String { path + "/" + name }

    /// The directory's descriptor, for calls that take one (it stays open as long as this handle lives).
    var rawDescriptor: Int32 { descriptor }
}

// `open` is variadic in C; Glibc's overlay gives Swift a fixed-arity version, named here to keep call sites clear.
@inline(__always)
private func Glibc_open(_ path: String, _ flags: Int32) -> Int32 { open(path, flags) }
