#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
#if os(Linux) || os(Android)
import CWormholeSystem
#endif

/// Unix `SOCK_SEQPACKET` sockets in a wormhole's `.live` directory: one per listening process and identifier.
///
/// Sequenced packets keep message boundaries, and a connection per message lets a requester see at once that its
/// responder's process has ended (the connection closes). Socket files are named by a hash of the identifier, the
/// process id and a random number, and are reached through `/proc/self/fd/N/NAME`, which keeps the address under
/// the 108 bytes a socket path may have, however deep the wormhole directory is.
enum LiveSocket {
    static let subdirectoryName = ".live"
    /// The largest message: sequenced packets travel whole in the socket buffer.
    static let maximumMessageSize = 64 * 1024

    /// The file-name prefix of an identifier's sockets.
    static func prefix(for identifier: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325  // FNV-1a
        for byte in identifier.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return String(hash, radix: 16) + "."
    }

    /// The file-name prefix of the sockets of an identifier's responders: apart from its listeners' sockets, so
    /// that a message never reaches a responder, nor a request a listener.
    static func responderPrefix(for identifier: String) -> String {
        prefix(for: identifier) + "r."
    }

    static func address(directoryDescriptor: Int32, name: String) -> sockaddr_un? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let path = Array("/proc/self/fd/\(directoryDescriptor)/\(name)".utf8CString)
        guard path.count <= MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            path.withUnsafeBytes { buffer.copyMemory(from: $0) }
        }
        return address
    }

    static func withAddress<T>(_ address: sockaddr_un, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
        withUnsafePointer(to: address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    static func makeSocket() -> Int32 {
        #if os(Linux) || os(Android)
        return socket(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        #else
        return socket(AF_UNIX, SOCK_SEQPACKET, 0)
        #endif
    }

    /// The user id of the process at the other end of a connected socket.
    static func peerUserID(_ socket: Int32) -> UInt32? {
        #if os(Linux) || os(Android)
        var uid: UInt32 = 0
        return cwormhole_peer_uid(socket, &uid) == 0 ? uid : nil
        #else
        var uid: uid_t = 0
        var gid: gid_t = 0
        guard getpeereid(socket, &uid, &gid) == 0 else { return nil }
        return UInt32(uid)
        #endif
    }

    /// Sends one packet, whole.
    static func send(_ socket: Int32, _ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { buffer in
            (try? valueOrErrno { Glibc_send(socket, buffer.baseAddress, buffer.count) }.get()) == buffer.count
        }
    }

    /// Receives one packet: nil when the peer closed the connection or an error occurred.
    static func receive(_ socket: Int32) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: maximumMessageSize + 4096)
        let count = buffer.withUnsafeMutableBytes { bytes in
            (try? valueOrErrno { recv(socket, bytes.baseAddress, bytes.count, 0) }.get()) ?? -1
        }
        guard count > 0 else { return nil }
        buffer.removeLast(buffer.count - count)
        return buffer
    }

    /// Waits until `socket` is readable, up to `milliseconds` (-1: no limit); false on time-out.
    static func waitReadable(_ socket: Int32, milliseconds: Int32) -> Bool {
        var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 && errno == EINTR { continue }
            return ready > 0
        }
    }
}

/// What travels in a live packet: the kind, the sender, and the payload (or an error text, in a failed reply).
struct LivePacket: Equatable {
    enum Kind: UInt8 {
        case message = 1, request = 2, reply = 3, failure = 4
    }
    var kind: Kind
    var sender: String
    var payload: [UInt8]

    func encoded() -> [UInt8] {
        let senderBytes = Array(sender.utf8.prefix(Int(UInt16.max)))
        var bytes: [UInt8] = [kind.rawValue, 0, 0]
        bytes.store(UInt16(senderBytes.count), at: 1)
        return bytes + senderBytes + payload
    }

    init(kind: Kind, sender: String, payload: [UInt8]) {
        self.kind = kind
        self.sender = sender
        self.payload = payload
    }

    init?(_ bytes: [UInt8]) {
        guard bytes.count >= 3, let kind = Kind(rawValue: bytes[0]) else { return nil }
        let senderLength = Int(bytes[1...].load(at: 0) as UInt16)
        guard bytes.count >= 3 + senderLength else { return nil }
        self.kind = kind
        self.sender = String(decoding: bytes[3..<3 + senderLength], as: UTF8.self)
        self.payload = Array(bytes[(3 + senderLength)...])
    }
}

@inline(__always)
private func Glibc_send(_ socket: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    #if os(Linux) || os(Android)
    return Glibc.send(socket, buffer, count, Int32(MSG_NOSIGNAL))
    #else
    return Darwin.send(socket, buffer, count, 0)
    #endif
}
