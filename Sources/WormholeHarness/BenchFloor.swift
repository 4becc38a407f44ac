import Foundation
import WormholeCLI

#if canImport(Glibc)
import Glibc
#endif

enum FloorKind: String {
    /// Write a temporary file, rename it over the message file; the reader wakes on IN_MOVED_TO.
    case rename
    /// Write the message file in place with pwrite; the reader wakes on IN_MODIFY.
    case inPlace = "in-place"
    /// Append the message to a log with O_APPEND; the reader wakes on IN_MODIFY and reads on from its offset.
    case append
}

#if os(Linux) || os(Android)
/// One side of the hand-written floor: the least a file-based ping-pong can do, with no library in the way.
///
/// Each side watches the directory with its own blocking inotify descriptor, exactly as a minimal program
/// would; 64-byte messages carry a counter.
final class FloorEndpoint {
    let kind: FloorKind
    let directory: String
    let receives: String
    let sends: String
    private let inotify: Int32
    private let buffer = UnsafeMutableRawPointer.allocate(byteCount: 4096, alignment: 8)
    private var message = [UInt8](repeating: 0x78, count: 64)
    private var sendDescriptor: Int32 = -1
    private var readOffset = 0

    init(kind: FloorKind, directory: String, receives: String, sends: String) throws {
        self.kind = kind
        self.directory = directory
        self.receives = receives
        self.sends = sends
        inotify = inotify_init1(Int32(IN_CLOEXEC))
        let mask = kind == .rename ? UInt32(IN_MOVED_TO) : UInt32(IN_MODIFY)
        if kind == .append {
            // Both logs exist before either side watches them.
            for name in [receives, sends] { close(open(directory + "/" + name, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)) }
        }
        guard inotify >= 0, inotify_add_watch(inotify, directory, mask) >= 0 else {
            throw Output.fail("inotify failed in \(directory): \(String(cString: strerror(errno)))")
        }
        if kind == .inPlace || kind == .append {
            let flags = kind == .append ? O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC : O_RDWR | O_CREAT | O_CLOEXEC
            sendDescriptor = open(directory + "/" + sends, flags, 0o600)
            guard sendDescriptor >= 0 else { throw Output.fail("could not open \(sends)") }
        }
    }

    deinit {
        close(inotify)
        if sendDescriptor >= 0 { close(sendDescriptor) }
        buffer.deallocate()
    }

    func send(_ counter: UInt64) throws {
        withUnsafeBytes(of: counter.littleEndian) { message.replaceSubrange(0..<8, with: $0) }
        switch kind {
        case .rename:
            let temporary = directory + "/." + sends + ".tmp"
            let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0, Glibc.write(fd, message, message.count) == message.count else {
                throw Output.fail("floor write failed")
            }
            close(fd)
            guard rename(temporary, directory + "/" + sends) == 0 else { throw Output.fail("floor rename failed") }
        case .inPlace:
            guard pwrite(sendDescriptor, message, message.count, 0) == message.count else {
                throw Output.fail("floor pwrite failed")
            }
        case .append:
            guard Glibc.write(sendDescriptor, message, message.count) == message.count else {
                throw Output.fail("floor append failed")
            }
        }
    }

    /// Blocks until the other side's message arrives, and returns its counter.
    func receive() throws -> UInt64 {
        while true {
            let count = read(inotify, buffer, 4096)
            guard count > 0 else { throw Output.fail("inotify read failed") }
            var offset = 0
            var arrived = false
            while offset < count {
                let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                if event.len > 0 {
                    let name = String(
                        cString: (buffer + offset + MemoryLayout<inotify_event>.size).assumingMemoryBound(
                            to: CChar.self
                        )
                    )
                    if name == receives { arrived = true }
                }
                offset += MemoryLayout<inotify_event>.size + Int(event.len)
            }
            guard arrived else { continue }
            let fd = open(directory + "/" + receives, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw Output.fail("floor open failed") }
            var incoming = [UInt8](repeating: 0, count: 64)
            let got = pread(fd, &incoming, 64, off_t(kind == .append ? readOffset : 0))
            close(fd)
            guard got == 64 else { continue }
            if kind == .append { readOffset += 64 }
            return incoming.withUnsafeBytes { $0.load(as: UInt64.self) }
        }
    }
}
#else
/// The hand-written floor watches its files with inotify, which exists on Linux only: elsewhere the floor's cases
/// report that they cannot run.
final class FloorEndpoint {
    init(kind: FloorKind, directory: String, receives: String, sends: String) throws {
        throw Output.fail("the hand-written floor waits with inotify, which exists on Linux only")
    }

    func send(_ counter: UInt64) throws {}

    func receive() throws -> UInt64 { 0 }
}
#endif
