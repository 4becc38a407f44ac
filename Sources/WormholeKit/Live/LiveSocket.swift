/// The names and sizes of the Unix `SOCK_SEQPACKET` sockets in a wormhole's `.live` directory: one per listening
/// process and identifier (the calls are ``PacketSocket``'s).
///
/// Sequenced packets keep message boundaries, and a connection per message lets a requester see at once that its
/// responder's process has ended (the connection closes). Socket files are named by a hash of the identifier, the
/// process id and a random number, and are reached through `/proc/self/fd/N/NAME` (``UnixSocketAddress``), which keeps
/// the address under the 108 bytes a socket path may have, however deep the wormhole directory is.
enum LiveSocket {
    static let subdirectoryName = ".live"
    /// The largest message: sequenced packets travel whole in the socket buffer.
    static let maximumMessageSize = 64 * 1024
    /// The size of a buffer that receives a packet whole: a message and its header.
    static let receiveBufferSize = maximumMessageSize + 4096

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
}

/// What travels in a live packet: the kind, the sender, and the payload (or an error text, in a failed reply).
package struct LivePacket: Equatable {
    package enum Kind: UInt8 {
        case message = 1
        case request = 2
        case reply = 3
        case failure = 4
    }
    package var kind: Kind
    package var sender: String
    package var payload: [UInt8]

    package func encoded() -> [UInt8] {
        let senderBytes = Array(sender.utf8.prefix(Int(UInt16.max)))
        var bytes: [UInt8] = [kind.rawValue, 0, 0]
        bytes.store(UInt16(senderBytes.count), at: 1)
        return bytes + senderBytes + payload
    }

    package init(kind: Kind, sender: String, payload: [UInt8]) {
        self.kind = kind
        self.sender = sender
        self.payload = payload
    }

    package init?(_ bytes: [UInt8]) {
        guard let packet = bytes.withUnsafeBytes({ LivePacket($0) }) else { return nil }
        self = packet
    }

    /// Decodes a packet where it was received, copying out only the sender and the payload.
    package init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count >= 3, let kind = Kind(rawValue: bytes[0]) else { return nil }
        let senderLength = Int(bytes[1]) | Int(bytes[2]) << 8  // little-endian
        guard bytes.count >= 3 + senderLength else { return nil }
        self.kind = kind
        self.sender = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[3..<3 + senderLength]), as: UTF8.self)
        self.payload = Array(UnsafeRawBufferPointer(rebasing: bytes[(3 + senderLength)...]))
    }
}
