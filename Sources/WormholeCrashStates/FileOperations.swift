/// What a workload did to the files under one directory, in order: the input of ``CrashStates``.
///
/// Made from a system-call trace by following names to inodes and descriptors to open files, as the kernel does, so
/// that a rename, a hard link or a write through an old descriptor lands on the right file. Everything outside the
/// directory is ignored; the directory must be empty when the trace starts.
public struct FileOperations: Sendable {
    /// One change a power cut may keep or lose, a synchronisation that makes earlier ones durable, or a marker.
    public enum Operation: Sendable, Equatable {
        /// A new empty regular file named `name` in the directory `parent`.
        case create(parent: Int, name: String, inode: Int)
        /// A new directory.
        case makeDirectory(parent: Int, name: String, inode: Int)
        /// Another name for an existing file.
        case link(parent: Int, name: String, inode: Int)
        /// A name removed (a file's or an empty directory's).
        case remove(parent: Int, name: String)
        /// A rename, replacing what `toName` named.
        case rename(fromParent: Int, fromName: String, toParent: Int, toName: String)
        /// Bytes written at an offset. `extends` when they reach past the file's size at the time.
        case write(inode: Int, offset: Int, bytes: [UInt8], extends: Bool)
        /// The file's size set.
        case truncate(inode: Int, size: Int)
        /// A range zeroed in place, its blocks freed (`fallocate` punching a hole, keeping the size).
        case zero(inode: Int, offset: Int, length: Int)
        /// `fsync` or `fdatasync` of a file or a directory: what came before on it is on the disk.
        case synchronize(inode: Int)
        /// `sync` or `syncfs`: everything before is on the disk.
        case synchronizeAll
        /// A line the workload wrote (with `write(-1, …)`) to say that a call returned.
        case marker(String)

        /// One line for a report, with a write's length in place of its bytes.
        public var summary: String {
            switch self {
            case .write(let inode, let offset, let bytes, let extends):
                "write inode \(inode) at \(offset), \(bytes.count) bytes\(extends ? ", extending it" : "")"
            default: "\(self)"
            }
        }

        /// Whether this changes a directory (rather than a file's bytes).
        var isDirectoryChange: Bool {
            switch self {
            case .create, .makeDirectory, .link, .remove, .rename: true
            default: false
            }
        }

        /// The directories a directory change touches.
        var parents: [Int] {
            switch self {
            case .create(let parent, _, _), .makeDirectory(let parent, _, _), .link(let parent, _, _),
                .remove(let parent, _):
                [parent]
            case .rename(let from, _, let to, _): from == to ? [from] : [from, to]
            default: []
            }
        }

        /// The file whose bytes this changes.
        var dataInode: Int? {
            switch self {
            case .write(let inode, _, _, _), .truncate(let inode, _), .zero(let inode, _, _): inode
            default: nil
            }
        }
    }

    /// The operations in the order they completed.
    public var operations: [Operation]
    /// The inode of the root directory (always 0).
    public static let root = 0
    /// Which inodes are directories.
    public var directories: Set<Int>

    /// Follows a trace of a workload that worked under `root` (an absolute path, as strace prints it).
    public init(calls: [SystemCall], root: String) throws(TraceError) {
        var interpreter = Interpreter(root: root)
        for call in calls where call.result >= 0 || (call.name == "write" && call.arguments.first?.number == -1) {
            try interpreter.apply(call)
        }
        operations = interpreter.operations
        directories = interpreter.directories
    }

    /// Operations given directly, for tests of the explorer itself.
    public init(operations: [Operation], directories: Set<Int> = [FileOperations.root]) {
        self.operations = operations
        self.directories = directories
    }
}

/// The kernel's view while the trace is followed: names to inodes, descriptors to open files.
private struct Interpreter {
    /// An open file description: shared by `dup`s, with its own offset.
    final class OpenFile {
        let inode: Int
        var offset = 0
        let appends: Bool
        init(inode: Int, appends: Bool) {
            self.inode = inode
            self.appends = appends
        }
    }

    let root: String
    var operations: [FileOperations.Operation] = []
    var directories: Set<Int> = [FileOperations.root]
    /// Relative path ("" for the root) to inode.
    var names: [String: Int] = ["": FileOperations.root]
    var sizes: [Int: Int] = [:]
    var descriptors: [Int64: OpenFile] = [:]
    var nextInode = 1

    init(root: String) { self.root = root.hasSuffix("/") ? String(root.dropLast()) : root }

    /// The path relative to the root of a `(dirfd, name)` pair, or nil when it is outside.
    func relative(_ directory: SystemCall.Argument?, _ name: [UInt8]) -> String? {
        let name = String(decoding: name, as: UTF8.self)
        var absolute: String
        if name.hasPrefix("/") {
            absolute = name
        } else {
            guard let base = directory?.path else { return nil }
            absolute = name.isEmpty ? base : base + "/" + name
        }
        var parts: [Substring] = []
        for part in absolute.split(separator: "/") where part != "." {
            if part == ".." { _ = parts.popLast() } else { parts.append(part) }
        }
        absolute = "/" + parts.joined(separator: "/")
        if absolute == root { return "" }
        guard absolute.hasPrefix(root + "/") else { return nil }
        return String(absolute.dropFirst(root.count + 1))
    }

    func split(_ path: String) -> (parent: String, name: String) {
        guard let slash = path.lastIndex(of: "/") else { return ("", path) }
        return (String(path[..<slash]), String(path[path.index(after: slash)...]))
    }

    func parentInode(_ path: String) throws(TraceError) -> Int {
        let parent = split(path).parent
        guard let inode = names[parent], directories.contains(inode) else {
            throw TraceError("the trace uses \(path) in a directory it never made (the directory must start empty)")
        }
        return inode
    }

    mutating func newInode() -> Int {
        defer { nextInode += 1 }
        return nextInode
    }

    mutating func apply(_ call: SystemCall) throws(TraceError) {
        let arguments = call.arguments
        switch call.name {
        case "write" where arguments.first?.number == -1:
            if let bytes = arguments[1].bytes { operations.append(.marker(String(decoding: bytes, as: UTF8.self))) }
        case "open", "openat", "creat":
            let (directory, nameIndex): (SystemCall.Argument?, Int) =
                call.name == "openat" ? (arguments[0], 1) : (nil, 0)
            guard let name = arguments[nameIndex].bytes,
                let path = relative(directory ?? .word("AT_FDCWD", path: "/"), name)
            else { return }
            let flags = call.name == "creat" ? ["O_CREAT", "O_TRUNC", "O_WRONLY"] : arguments[nameIndex + 1].words
            var inode = names[path]
            if inode == nil {
                guard flags.contains("O_CREAT") else { throw TraceError("opened \(path), which the trace never made") }
                let created = newInode()
                let parent = try parentInode(path)
                operations.append(.create(parent: parent, name: split(path).name, inode: created))
                names[path] = created
                sizes[created] = 0
                inode = created
            } else if flags.contains("O_TRUNC"), let inode, !directories.contains(inode), sizes[inode] != 0 {
                operations.append(.truncate(inode: inode, size: 0))
                sizes[inode] = 0
            }
            descriptors[call.result] = OpenFile(inode: inode!, appends: flags.contains("O_APPEND"))
        case "mkdir", "mkdirat":
            let (directory, nameIndex): (SystemCall.Argument?, Int) =
                call.name == "mkdirat" ? (arguments[0], 1) : (nil, 0)
            guard let name = arguments[nameIndex].bytes,
                let path = relative(directory ?? .word("AT_FDCWD", path: "/"), name)
            else { return }
            let inode = newInode()
            operations.append(.makeDirectory(parent: try parentInode(path), name: split(path).name, inode: inode))
            names[path] = inode
            directories.insert(inode)
        case "close":
            if let descriptor = arguments.first?.number { descriptors[descriptor] = nil }
        case "dup", "dup2", "dup3":
            if let old = arguments.first?.number, let file = descriptors[old] { descriptors[call.result] = file }
        case "fcntl", "fcntl64":
            if arguments.count >= 2, arguments[1].words.contains(where: { $0.hasPrefix("F_DUPFD") }),
                let old = arguments.first?.number, let file = descriptors[old]
            {
                descriptors[call.result] = file
            }
        case "lseek":
            guard let descriptor = arguments.first?.number, let file = descriptors[descriptor] else { return }
            if !arguments[2].words.contains("SEEK_DATA"), !arguments[2].words.contains("SEEK_HOLE") {
                file.offset = Int(call.result)
            }
        case "read":
            // power-loss does not trace reads (see its tracedCalls); followed should another trace hold them.
            if let descriptor = arguments.first?.number, let file = descriptors[descriptor] {
                file.offset += Int(call.result)
            }
        case "write", "pwrite64", "writev", "pwritev", "pwritev2":
            guard let descriptor = arguments.first?.number, let file = descriptors[descriptor] else { return }
            var bytes: [UInt8] = []
            if call.name.hasPrefix("pwritev") || call.name == "writev" {
                guard case .array(let vectors) = arguments[1] else {
                    throw TraceError("unreadable iovec in \(call.name)")
                }
                for vector in vectors {
                    guard case .structure(let fields) = vector, let base = fields.first?.1.bytes else {
                        throw TraceError("unreadable iovec in \(call.name)")
                    }
                    bytes += base
                }
            } else {
                guard let written = arguments[1].bytes else { throw TraceError("unreadable buffer in \(call.name)") }
                bytes = written
            }
            bytes = Array(bytes.prefix(Int(call.result)))
            let size = sizes[file.inode] ?? 0
            let offset: Int
            if call.name.hasPrefix("pwrite") {
                guard let at = arguments[3].number else {
                    throw TraceError("unreadable offset in \(call.name)")
                }
                offset = Int(at)
            } else {
                offset = file.appends ? size : file.offset
                file.offset = offset + bytes.count
            }
            guard !bytes.isEmpty else { return }
            operations.append(
                .write(inode: file.inode, offset: offset, bytes: bytes, extends: offset + bytes.count > size)
            )
            sizes[file.inode] = max(size, offset + bytes.count)
        case "ftruncate", "truncate":
            let inode: Int
            if call.name == "ftruncate" {
                guard let descriptor = arguments.first?.number, let file = descriptors[descriptor] else { return }
                inode = file.inode
            } else {
                guard let name = arguments[0].bytes, let path = relative(.word("AT_FDCWD", path: "/"), name),
                    let named = names[path]
                else { return }
                inode = named
            }
            guard let size = arguments[1].number else { throw TraceError("unreadable length in \(call.name)") }
            operations.append(.truncate(inode: inode, size: Int(size)))
            sizes[inode] = Int(size)
        case "fallocate":
            guard let descriptor = arguments.first?.number, let file = descriptors[descriptor],
                let offset = arguments[2].number, let length = arguments[3].number
            else { return }
            let mode = arguments[1].words
            if mode.contains("FALLOC_FL_PUNCH_HOLE") || mode.contains("FALLOC_FL_ZERO_RANGE") {
                operations.append(.zero(inode: file.inode, offset: Int(offset), length: Int(length)))
            } else if !mode.contains("FALLOC_FL_KEEP_SIZE"), Int(offset + length) > sizes[file.inode] ?? 0 {
                operations.append(.truncate(inode: file.inode, size: Int(offset + length)))
                sizes[file.inode] = Int(offset + length)
            }
        // (sync_file_range flushes neither the disk's cache nor the file's size: it makes nothing durable.)
        case "fsync", "fdatasync":
            if let descriptor = arguments.first?.number, let file = descriptors[descriptor] {
                operations.append(.synchronize(inode: file.inode))
            }
        case "sync", "syncfs":
            operations.append(.synchronizeAll)
        case "rename", "renameat", "renameat2":
            let at = call.name != "rename"
            guard let from = arguments[at ? 1 : 0].bytes, let to = arguments[at ? 3 : 1].bytes else { return }
            let fromPath = relative(at ? arguments[0] : .word("AT_FDCWD", path: "/"), from)
            let toPath = relative(at ? arguments[2] : .word("AT_FDCWD", path: "/"), to)
            guard let fromPath, let toPath else {
                if fromPath != nil || toPath != nil { throw TraceError("a rename across the root's edge") }
                return
            }
            guard let inode = names[fromPath] else {
                throw TraceError("renamed \(fromPath), which the trace never made")
            }
            operations.append(
                .rename(
                    fromParent: try parentInode(fromPath),
                    fromName: split(fromPath).name,
                    toParent: try parentInode(toPath),
                    toName: split(toPath).name
                )
            )
            names[fromPath] = nil
            if directories.contains(inode) {
                for (path, value) in names where path.hasPrefix(fromPath + "/") {
                    names[path] = nil
                    names[toPath + path.dropFirst(fromPath.count)] = value
                }
            }
            names[toPath] = inode
        case "link", "linkat":
            let at = call.name == "linkat"
            guard let from = arguments[at ? 1 : 0].bytes, let to = arguments[at ? 3 : 1].bytes,
                let fromPath = relative(at ? arguments[0] : .word("AT_FDCWD", path: "/"), from),
                let toPath = relative(at ? arguments[2] : .word("AT_FDCWD", path: "/"), to),
                let inode = names[fromPath]
            else { return }
            operations.append(.link(parent: try parentInode(toPath), name: split(toPath).name, inode: inode))
            names[toPath] = inode
        case "unlink", "unlinkat", "rmdir":
            let at = call.name == "unlinkat"
            guard let name = arguments[at ? 1 : 0].bytes,
                let path = relative(at ? arguments[0] : .word("AT_FDCWD", path: "/"), name), names[path] != nil
            else { return }
            operations.append(.remove(parent: try parentInode(path), name: split(path).name))
            names[path] = nil
        default:
            break
        }
    }
}
