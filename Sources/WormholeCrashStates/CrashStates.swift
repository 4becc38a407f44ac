import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The states a power cut may leave on the disk, at each point of a workload: the explorer's model of a file system.
///
/// The model is ext4's default mode (`data=ordered`, journalled metadata), made conservative where it is cheap to be:
///
/// - **Durable.** An operation is on the disk for sure once an `fsync`/`fdatasync` of its file (for a change of a
///   directory: of that directory, or of either directory of a rename) or a `sync` came after it. A power cut keeps
///   every durable operation.
/// - **Directory changes** (creations, links, removals, renames) that are not durable reach the disk in the order they
///   were made, as ext4's journal commits them: a power cut keeps a prefix of them.
/// - **A file's size** grows and shrinks in order: the writes that extend a file and its truncations are kept as a
///   prefix (with `data=ordered`, the bytes under a size are written before the size is committed), and the first
///   one dropped may be torn: its bytes kept up to a 512-byte boundary of the file.
/// - **Writes inside a file's size** reach the disk in any order: any subset is kept, each possibly torn at a
///   512-byte boundary (its part before the boundary kept, or its part after).
///
/// It does not model a disk that lies about its cache, a file system other than ext4's defaults (`data=writeback`,
/// `nodelalloc`, XFS, btrfs), bit rot, or a sector torn anywhere but at a 512-byte boundary.
public struct CrashStates: Sendable {
    /// The workload's operations.
    public let operations: FileOperations
    /// For each operation, the index of the first one that makes it durable (`Int.max` when none does).
    private let durableFrom: [Int]

    /// Prepares the states of a traced workload.
    public init(_ operations: FileOperations) {
        self.operations = operations
        let list = operations.operations
        var durableFrom = [Int](repeating: .max, count: list.count)
        // Walk backwards, remembering the next synchronisation of each inode.
        var nextSync: [Int: Int] = [:]
        var nextSyncAll = Int.max
        for index in list.indices.reversed() {
            let operation = list[index]
            switch operation {
            case .synchronize(let inode): nextSync[inode] = index
            case .synchronizeAll: nextSyncAll = index
            default:
                var covering = nextSyncAll
                if let inode = operation.dataInode { covering = min(covering, nextSync[inode] ?? .max) }
                for parent in operation.parents { covering = min(covering, nextSync[parent] ?? .max) }
                durableFrom[index] = covering
            }
        }
        self.durableFrom = durableFrom
    }

    /// The points where a crash is explored: just before each synchronisation and each marker, and at the end.
    ///
    /// Between two of these, every later point can lose all that an earlier one can, so nothing is missed.
    public var crashPoints: [Int] {
        var points: [Int] = []
        for (index, operation) in operations.operations.enumerated() {
            switch operation {
            case .synchronize, .synchronizeAll, .marker: if points.last != index { points.append(index) }
            default: break
            }
        }
        if points.last != operations.operations.count { points.append(operations.operations.count) }
        return points
    }

    /// The markers the workload wrote before `point`.
    public func markers(before point: Int) -> [String] {
        operations.operations.prefix(point).compactMap {
            if case .marker(let text) = $0 { return text }
            return nil
        }
    }

    /// Up to `budget` distinct states at `point`: the one a crash of the process alone leaves, the one that keeps only
    /// what is durable, each choice varied alone, then random combinations.
    public func states<Generator: RandomNumberGenerator>(
        at point: Int,
        budget: Int,
        using generator: inout Generator
    ) -> [CrashState] {
        let dimensions = self.dimensions(at: point)
        var seenChoices: Set<[Int]> = []
        var seenTrees: Set<FileTree> = []
        var states: [CrashState] = []
        func consider(_ choices: [Int]) {
            guard states.count < budget, seenChoices.insert(choices).inserted else { return }
            let tree = self.tree(at: point, dimensions: dimensions, choices: choices)
            guard seenTrees.insert(tree).inserted else { return }
            states.append(
                CrashState(point: point, tree: tree, summary: summary(dimensions: dimensions, choices: choices))
            )
        }
        let all = dimensions.map(\.keptOption)
        let none = dimensions.map { _ in 0 }
        consider(all)
        consider(none)
        for (index, dimension) in dimensions.enumerated() {
            for option in 0..<dimension.options {
                var choices = all
                choices[index] = option
                consider(choices)
                choices = none
                choices[index] = option
                consider(choices)
            }
        }
        var attempts = 0
        while states.count < budget, attempts < budget * 4, !dimensions.isEmpty {
            attempts += 1
            consider(dimensions.map { Int.random(in: 0..<$0.options, using: &generator) })
        }
        return states
    }

    // MARK: - Choices

    /// One independent choice a power cut makes at a point.
    struct Dimension {
        enum Kind {
            /// How many of the pending directory changes are kept (a prefix).
            case directoryPrefix(pending: [Int])
            /// How much of a file's chain of size changes is kept: option `o` keeps the first `o` when
            /// `o <= chain.count`; past that, a torn point of a dropped write (`tears[o - chain.count - 1]`).
            case sizeChain(inode: Int, chain: [Int], tears: [(chainIndex: Int, at: Int)])
            /// Whether one write inside the file's size is kept: 0 dropped, 1 kept, `2 + t` its part before
            /// `tears[t]` kept, `2 + tears.count + t` its part from `tears[t]` on.
            case inPlace(operation: Int, tears: [Int])
        }
        var kind: Kind
        var options: Int

        /// The option that keeps everything: what a crash of the process alone leaves.
        var keptOption: Int {
            switch kind {
            case .directoryPrefix(let pending): pending.count
            case .sizeChain(_, let chain, _): chain.count
            case .inPlace: 1
            }
        }
    }

    func dimensions(at point: Int) -> [Dimension] {
        let list = operations.operations
        var pendingDirectory: [Int] = []
        var chains: [Int: [Int]] = [:]
        var inodesInOrder: [Int] = []
        var dimensions: [Dimension] = []
        for index in 0..<point where durableFrom[index] >= point {
            let operation = list[index]
            if operation.isDirectoryChange {
                pendingDirectory.append(index)
                continue
            }
            switch operation {
            case .write(let inode, _, _, true), .truncate(let inode, _):
                if chains[inode] == nil { inodesInOrder.append(inode) }
                chains[inode, default: []].append(index)
            case .write(_, let offset, let bytes, false):
                let tears = Self.tearPoints(offset: offset, count: bytes.count)
                dimensions.append(
                    Dimension(kind: .inPlace(operation: index, tears: tears), options: 2 + 2 * tears.count)
                )
            case .zero:
                dimensions.append(Dimension(kind: .inPlace(operation: index, tears: []), options: 2))
            default: break
            }
        }
        if !pendingDirectory.isEmpty {
            dimensions.insert(
                Dimension(kind: .directoryPrefix(pending: pendingDirectory), options: pendingDirectory.count + 1),
                at: 0
            )
        }
        for inode in inodesInOrder {
            let chain = chains[inode]!
            var tears: [(Int, Int)] = []
            for (position, index) in chain.enumerated() {
                if case .write(_, let offset, let bytes, _) = list[index] {
                    tears += Self.tearPoints(offset: offset, count: bytes.count).map { (position, $0) }
                }
            }
            dimensions.append(
                Dimension(
                    kind: .sizeChain(inode: inode, chain: chain, tears: tears),
                    options: chain.count + 1 + tears.count
                )
            )
        }
        return dimensions
    }

    /// The 512-byte boundaries strictly inside a write, at most eight of them (the first, the last, evenly between).
    static func tearPoints(offset: Int, count: Int) -> [Int] {
        let first = (offset / 512 + 1) * 512
        let end = offset + count
        guard first < end else { return [] }
        let all = stride(from: first, to: end, by: 512).map { $0 }
        guard all.count > 8 else { return all }
        return (0..<8).map { all[$0 * (all.count - 1) / 7] }
    }

    // MARK: - Building a state

    func tree(at point: Int, dimensions: [Dimension], choices: [Int]) -> FileTree {
        let list = operations.operations
        // What each pending operation becomes: kept, dropped, or torn at an offset.
        var keptDirectory = Set<Int>()
        var torn: [Int: (at: Int, keepsSuffix: Bool)] = [:]
        var keptData = Set<Int>()
        var sizeLimit: [Int: Int] = [:]
        for (dimension, choice) in zip(dimensions, choices) {
            switch dimension.kind {
            case .directoryPrefix(let pending):
                keptDirectory.formUnion(pending.prefix(choice))
            case .sizeChain(let inode, let chain, let tears):
                if choice <= chain.count {
                    keptData.formUnion(chain.prefix(choice))
                    if choice < chain.count { sizeLimit[inode] = -1 }  // resolved below
                } else {
                    let tear = tears[choice - chain.count - 1]
                    keptData.formUnion(chain.prefix(tear.chainIndex))
                    torn[chain[tear.chainIndex]] = (tear.at, false)
                    sizeLimit[inode] = -1
                }
            case .inPlace(let operation, let tears):
                if choice == 1 { keptData.insert(operation) }
                if choice >= 2 {
                    let tear = choice - 2
                    torn[operation] = tear < tears.count ? (tears[tear], false) : (tears[tear - tears.count], true)
                }
            }
        }
        var tree = FileTree()
        var sizes: [Int: Int] = [:]
        for index in 0..<point {
            let durable = durableFrom[index] < point
            let operation = list[index]
            if operation.isDirectoryChange {
                if durable || keptDirectory.contains(index) { tree.apply(operation) }
                continue
            }
            guard let inode = operation.dataInode else { continue }
            let tornAt = torn[index]
            guard durable || keptData.contains(index) || tornAt != nil else { continue }
            switch operation {
            case .write(_, var offset, var bytes, let extends):
                if let tornAt {
                    if tornAt.keepsSuffix {
                        bytes = Array(bytes.dropFirst(tornAt.at - offset))
                        offset = tornAt.at
                    } else {
                        bytes = Array(bytes.prefix(tornAt.at - offset))
                    }
                }
                tree.write(inode: inode, offset: offset, bytes: bytes)
                if extends { sizes[inode] = max(sizes[inode] ?? 0, offset + bytes.count) }
            case .truncate(_, let size):
                tree.truncate(inode: inode, size: size)
                sizes[inode] = size
            case .zero(_, let offset, let length):
                tree.zero(inode: inode, offset: offset, length: length)
            default: break
            }
        }
        // A file whose size chain was cut keeps the size its kept part gave it: writes inside a size that was
        // dropped do not extend it.
        for inode in sizeLimit.keys { tree.truncate(inode: inode, size: sizes[inode] ?? 0) }
        return tree
    }

    func summary(dimensions: [Dimension], choices: [Int]) -> String {
        var parts: [String] = []
        for (dimension, choice) in zip(dimensions, choices) where choice != dimension.keptOption {
            switch dimension.kind {
            case .directoryPrefix(let pending):
                parts.append("directory changes: \(choice) of \(pending.count) kept (from #\(pending.first ?? 0))")
            case .sizeChain(let inode, let chain, let tears):
                if choice <= chain.count {
                    parts.append("inode \(inode): \(choice) of \(chain.count) size changes kept")
                } else {
                    let tear = tears[choice - chain.count - 1]
                    parts.append("inode \(inode): size change #\(chain[tear.chainIndex]) torn at \(tear.at)")
                }
            case .inPlace(let operation, let tears):
                if choice == 0 {
                    parts.append("write #\(operation) dropped")
                } else if choice - 2 < tears.count {
                    parts.append("write #\(operation) torn at \(tears[choice - 2]), its start kept")
                } else {
                    parts.append("write #\(operation) torn at \(tears[choice - 2 - tears.count]), its end kept")
                }
            }
        }
        return parts.isEmpty ? "everything kept" : parts.joined(separator: "; ")
    }
}

/// One state a power cut may leave: the files and their bytes, to be written out and opened.
public struct CrashState: Sendable {
    /// The crash point: the operations before this index had been made.
    public var point: Int
    /// The directories and files.
    public var tree: FileTree
    /// Which choices differ from a crash of the process alone, for a report.
    public var summary: String
}

/// Directories and files in memory, by inode, as a crash state holds them.
public struct FileTree: Sendable, Hashable {
    /// Each directory's entries: name to inode.
    public var entries: [Int: [String: Int]] = [FileOperations.root: [:]]
    /// Each regular file's bytes.
    public var contents: [Int: [UInt8]] = [:]

    mutating func apply(_ operation: FileOperations.Operation) {
        switch operation {
        case .create(let parent, let name, let inode), .link(let parent, let name, let inode):
            entries[parent, default: [:]][name] = inode
        case .makeDirectory(let parent, let name, let inode):
            entries[parent, default: [:]][name] = inode
            entries[inode] = entries[inode] ?? [:]
        case .remove(let parent, let name):
            entries[parent]?[name] = nil
        case .rename(let fromParent, let fromName, let toParent, let toName):
            guard let inode = entries[fromParent]?[fromName] else { return }
            entries[fromParent]?[fromName] = nil
            entries[toParent, default: [:]][toName] = inode
        default: break
        }
    }

    mutating func write(inode: Int, offset: Int, bytes: [UInt8]) {
        var content = contents[inode] ?? []
        if content.count < offset + bytes.count {
            content += [UInt8](repeating: 0, count: offset + bytes.count - content.count)
        }
        content.replaceSubrange(offset..<offset + bytes.count, with: bytes)
        contents[inode] = content
    }

    mutating func truncate(inode: Int, size: Int) {
        var content = contents[inode] ?? []
        if content.count > size { content.removeLast(content.count - size) }
        if content.count < size { content += [UInt8](repeating: 0, count: size - content.count) }
        contents[inode] = content
    }

    mutating func zero(inode: Int, offset: Int, length: Int) {
        guard var content = contents[inode], offset < content.count else { return }
        let end = min(content.count, offset + length)
        content.replaceSubrange(offset..<end, with: [UInt8](repeating: 0, count: end - offset))
        contents[inode] = content
    }

    /// Writes the tree under `directory` (which must exist and be empty): directories 0700, files 0600.
    public func materialize(into directory: String) throws {
        var visited: Set<Int> = []
        func walk(_ inode: Int, _ path: String) throws {
            guard visited.insert(inode).inserted else { return }
            for (name, child) in entries[inode] ?? [:] {
                let childPath = path + "/" + name
                if entries[child] != nil {
                    try FileManager.default.createDirectory(
                        atPath: childPath,
                        withIntermediateDirectories: false,
                        attributes: [.posixPermissions: 0o700]
                    )
                    try walk(child, childPath)
                } else {
                    // Plain open and write: Foundation's file writing costs more than the checks it feeds.
                    let descriptor = open(childPath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
                    guard descriptor >= 0 else {
                        throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: childPath])
                    }
                    defer { close(descriptor) }
                    let bytes = contents[child] ?? []
                    let written = bytes.withUnsafeBytes { writeAll(descriptor, $0) }
                    guard written == bytes.count else {
                        throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: childPath])
                    }
                }
            }
            visited.remove(inode)
        }
        try walk(FileOperations.root, directory)
    }

    /// A listing for a report: each file's path and size.
    public var listing: [String] {
        var lines: [String] = []
        func walk(_ inode: Int, _ path: String) {
            for (name, child) in (entries[inode] ?? [:]).sorted(by: { $0.key < $1.key }) {
                if entries[child] != nil {
                    walk(child, path + name + "/")
                } else {
                    lines.append("\(path)\(name): \(contents[child]?.count ?? 0) bytes")
                }
            }
        }
        walk(FileOperations.root, "")
        return lines
    }
}

/// `write(2)`, by a name that `FileTree.write` does not shadow.
private func writeAll(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer) -> Int {
    guard let base = bytes.baseAddress else { return 0 }
    return write(descriptor, base, bytes.count)
}
