import Foundation
import SystemPackage

/// The names and sizes of the Unix sockets in a wormhole's `.live` directory: one per listening or responding process
/// and identifier (the calls are ``PacketSocket``'s).
///
/// A listener of messages has a `SOCK_DGRAM` socket: every sender's datagrams arrive on it, and its thread waits in one
/// blocking receive, the cheapest wake-up a socket has. A responder has a `SOCK_SEQPACKET` socket: a connection per
/// request lets a requester see at once that its responder's process has ended (the connection closes). Both keep
/// message boundaries (on Apple platforms, which have no `SOCK_SEQPACKET`, a responder's socket is a stream whose
/// packets travel as frames: ``PacketSocket/connectionsAreFramed``). Socket files are named by a hash of the identifier
/// and a random part (``LiveSocketNaming``), and are reached through `/proc/self/fd/N/NAME` on Linux
/// (``UnixSocketAddress``), which keeps the address under the 108 bytes a socket path may have, however deep the
/// wormhole directory is; on Apple platforms, where an address is a path, ``LiveSocketPlacement`` says where they go.
enum LiveSocket {
    static let subdirectoryName = ".live"
    /// The largest message: sequenced packets travel whole in the socket buffer.
    static let maximumMessageSize = 64 * 1024
    /// The size of a buffer that receives a packet whole: a message and its header.
    static let receiveBufferSize = maximumMessageSize + 4096

    /// The file-name prefix of an identifier's sockets in Linux's names (``LiveSocketNaming/long``): its FNV-1a hash
    /// in hexadecimal. (Listeners of releases before datagrams had sequenced-packet sockets named with this prefix
    /// alone; a sender of this release does not look for them, and theirs cannot connect to these.)
    static func prefix(for identifier: String) -> String {
        String(LiveSocketNaming.hash(identifier), radix: 16) + "."
    }

    /// Makes a socket of `kind`, bound (and, for sequenced packets, listening) under a hidden name, then renamed to
    /// a new name under `prefix` (``LiveSocketNaming/newName(prefix:)``): a sender that found a socket bound but not
    /// yet listening would take it for a dead one's and remove it. The rename replaces nothing: a name another socket
    /// has (short names' random part is 35 bits) is drawn again. Returns the socket and its file's name.
    static func publish(
        _ kind: PacketSocket.Kind,
        in directory: DirectoryHandle,
        naming: LiveSocketNaming,
        prefix: String,
        identifier: String
    ) throws(WormholeError) -> (PacketSocket, name: String) {
        var name = naming.newName(prefix: prefix)
        let socket: PacketSocket
        switch PacketSocket.make(kind) {
        case .success(let value): socket = value
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "create a socket", identifier: identifier, path: nil)
        }
        let staging = naming.stagingName(for: name)
        guard let address = UnixSocketAddress(directory: directory, name: staging) else {
            socket.close()
            throw WormholeError(
                .ioFailure,
                "The socket's address is longer than a Unix socket address may be (\(directory.path)/\(staging)); "
                    + "use a wormhole directory with a shorter path for live messages.",
                identifier: identifier
            )
        }
        // Only who may write to the socket file may send to it. A datagram carries no check of its sender (a
        // connection is checked with `SO_PEERCRED`), so unless the directory is shared, the file is its owner's alone.
        let mode =
            kind == .datagrams && !directory.trustsOtherOwners
            ? directory.filePermissions & 0o700 : directory.filePermissions
        let listened = socket.bind(to: address)
            .flatMap { directory.setMode(ofEntry: staging, to: mode) }
            .flatMap { kind == .sequencedPackets ? socket.listen(backlog: 128) : .success(()) }
            .flatMap { () -> Result<Void, Errno> in
                if let group = directory.group { _ = directory.setGroup(ofEntry: staging, to: group) }
                for _ in 0..<8 {
                    let moved = directory.moveEntryWithoutReplacing(staging, to: directory, as: name)
                    guard case .failure(.fileExists) = moved else { return moved }
                    name = naming.newName(prefix: prefix)
                }
                return .failure(.fileExists)
            }
        if case .failure(let errno) = listened {
            socket.close()
            _ = directory.removeFile(named: staging)
            throw WormholeError.fileSystem(
                errno,
                "listen on a socket",
                identifier: identifier,
                path: directory.filePath(name)
            )
        }
        return (socket, name)
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
    package var payload: Data

    /// The bytes before the payload: the kind, the sender's length (little-endian) and the sender. A sender sends
    /// them and its payload as one packet (``PacketSocket/send(head:body:waiting:)``), so this is made once per sender.
    package static func head(kind: Kind, sender: String) -> [UInt8] {
        let senderBytes = Array(sender.utf8.prefix(Int(UInt16.max)))
        var bytes: [UInt8] = [kind.rawValue, 0, 0]
        bytes.store(UInt16(senderBytes.count), at: 1)
        return bytes + senderBytes
    }

    package func encoded() -> [UInt8] {
        Self.head(kind: kind, sender: sender) + payload
    }

    package init(kind: Kind, sender: String, payload: Data) {
        self.kind = kind
        self.sender = sender
        self.payload = payload
    }

    package init?(_ bytes: [UInt8]) {
        guard let packet = bytes.withUnsafeBytes({ LivePacket($0) }) else { return nil }
        self = packet
    }

    /// Decodes a packet where it was received, copying out only the sender and the payload. A sender equal to
    /// `knownSender`'s bytes reuses that string rather than decoding a new one (the endpoint passes the last packet's).
    package init?(_ bytes: UnsafeRawBufferPointer, knownSender: String? = nil) {
        guard bytes.count >= 3, let kind = Kind(rawValue: bytes[0]) else { return nil }
        let senderLength = Int(bytes[1]) | Int(bytes[2]) << 8  // little-endian
        guard bytes.count >= 3 + senderLength else { return nil }
        self.kind = kind
        let senderBytes = UnsafeRawBufferPointer(rebasing: bytes[3..<3 + senderLength])
        if let knownSender, Self.bytes(of: knownSender, equal: senderBytes) {
            self.sender = knownSender
        } else {
            self.sender = String(decoding: senderBytes, as: UTF8.self)
        }
        self.payload = Data(UnsafeRawBufferPointer(rebasing: bytes[(3 + senderLength)...]))
    }

    /// Whether `string`'s UTF-8 bytes are `bytes`, compared with `memcmp` where the string is contiguous.
    private static func bytes(of string: String, equal bytes: UnsafeRawBufferPointer) -> Bool {
        let compared = string.utf8.withContiguousStorageIfAvailable { (utf8) -> Bool in
            guard utf8.count == bytes.count else { return false }
            guard let left = utf8.baseAddress, let right = bytes.baseAddress else { return true }  // both empty
            return memcmp(left, right, bytes.count) == 0
        }
        return compared ?? string.utf8.elementsEqual(bytes)
    }
}
