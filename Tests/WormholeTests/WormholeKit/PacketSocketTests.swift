import Foundation
import SystemPackage
import Testing

@testable import WormholeKit

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The calls under live messages: a packet sent in two parts, several received with one call, the end of a
/// connection seen after the packets before it, a packet too large for its slot refused, and a packet's sender
/// compared with the last one's.
#if os(Linux) || os(Android)
// Sequenced packets are Linux's: XNU's local domain has stream and datagram sockets only.
@Suite("Live packets on a real socket pair", .limit(minutes: 1))
struct PacketSocketTests {
    /// A connected pair of `SOCK_SEQPACKET` sockets: `[0]` sends, `[1]` receives.
    ///
    /// Close-on-exec: a child process that another test starts meanwhile would otherwise keep the sending end open,
    /// and its close would not end the connection (a receive found it drained, not closed, now and then).
    func socketPair() throws -> (PacketSocket, PacketSocket) {
        var descriptors: [Int32] = [-1, -1]
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        try #require(socketpair(AF_UNIX, type, 0, &descriptors) == 0, "socketpair failed: errno \(errno)")
        return (PacketSocket(rawValue: descriptors[0]), PacketSocket(rawValue: descriptors[1]))
    }

    /// Sends a packet as a live sender does; true when it went out whole.
    func send(_ packet: LivePacket, on socket: PacketSocket) -> Bool {
        let result = LivePacket.head(kind: packet.kind, sender: packet.sender).withUnsafeBytes { head in
            packet.payload.withUnsafeBytes { body in socket.send(head: head, body: body) }
        }
        if case .success = result { return true }
        return false
    }

    @Test("Packets sent in two parts arrive whole, several per call, and the end of the connection after them")
    func batchThenEnd() throws {
        let (sending, receiving) = try socketPair()
        defer { receiving.close() }
        let packets = (0..<3).map {
            LivePacket(kind: .message, sender: "app[\($0)]", payload: Data(repeating: UInt8($0), count: 100 * $0))
        }
        for packet in packets { #expect(send(packet, on: sending)) }
        sending.close()
        let batch = PacketBatch(capacity: 8, slotSize: LiveSocket.receiveBufferSize)
        let received = receiving.receive(into: batch)
        #expect(received == PacketSocket.ReceivedPackets(count: 3, then: .closed))
        for index in 0..<received.count {
            #expect(LivePacket(batch.packet(at: index)) == packets[index])
            #expect(Array(batch.packet(at: index)) == packets[index].encoded())
        }
    }

    @Test("A full batch says that more may wait; the last call finds nothing and says so")
    func fullThenDrained() throws {
        let (sending, receiving) = try socketPair()
        defer {
            sending.close()
            receiving.close()
        }
        for index in 0..<3 {
            #expect(send(LivePacket(kind: .message, sender: "app", payload: Data([UInt8(index)])), on: sending))
        }
        let batch = PacketBatch(capacity: 2, slotSize: 256)
        #expect(receiving.receive(into: batch) == PacketSocket.ReceivedPackets(count: 2, then: .full))
        #expect(LivePacket(batch.packet(at: 1))?.payload == Data([1]))
        #expect(receiving.receive(into: batch) == PacketSocket.ReceivedPackets(count: 1, then: .drained))
        #expect(LivePacket(batch.packet(at: 0))?.payload == Data([2]))
        #expect(receiving.receive(into: batch) == PacketSocket.ReceivedPackets(count: 0, then: .drained))
    }

    @Test("A packet larger than its slot is refused with its connection, never delivered cut short")
    func oversizedPacket() throws {
        let (sending, receiving) = try socketPair()
        defer {
            sending.close()
            receiving.close()
        }
        let small = LivePacket(kind: .message, sender: "app", payload: Data([1]))
        #expect(send(small, on: sending))
        #expect(send(LivePacket(kind: .message, sender: "app", payload: Data(count: 300)), on: sending))
        let batch = PacketBatch(capacity: 8, slotSize: 256)
        #expect(receiving.receive(into: batch) == PacketSocket.ReceivedPackets(count: 1, then: .closed))
        #expect(LivePacket(batch.packet(at: 0)) == small)
    }

    @Test("One packet received alone (a reply) that fills its buffer is refused too, never delivered cut short")
    func oversizedReply() throws {
        let (sending, receiving) = try socketPair()
        defer {
            sending.close()
            receiving.close()
        }
        #expect(send(LivePacket(kind: .reply, sender: "widget", payload: Data(count: 300)), on: sending))
        #expect(send(LivePacket(kind: .reply, sender: "widget", payload: Data([7])), on: sending))
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256, alignment: 8)
        defer { buffer.deallocate() }
        #expect(receiving.receive(into: buffer, blocking: true) == .closed)
        #expect(receiving.receive(into: buffer, blocking: true) == .packet(count: 3 + 6 + 1))
    }

    @Test("A packet decoded with its sender known gives the same packet; with another sender known, its own")
    func knownSender() throws {
        let packet = LivePacket(kind: .request, sender: "widget[42] — ünïcode", payload: Data("{}".utf8))
        let bytes = packet.encoded()
        bytes.withUnsafeBytes { buffer in
            #expect(LivePacket(buffer, knownSender: packet.sender) == packet)
            #expect(LivePacket(buffer, knownSender: "app[1]") == packet)
            #expect(LivePacket(buffer, knownSender: "") == packet)
        }
        let anonymous = LivePacket(kind: .message, sender: "", payload: Data())
        anonymous.encoded().withUnsafeBytes { buffer in
            #expect(LivePacket(buffer, knownSender: "") == anonymous)
            #expect(LivePacket(buffer, knownSender: "app") == anonymous)
        }
    }
}
#endif

/// The mode and group a live endpoint gives its socket file are never set through a link that a member of a shared
/// group could put in the file's place between `bind` and the call (a review found them followed).
@Suite("Socket file modes through a planted link", .limit(minutes: 1))
struct SocketFileModeTests {
    let directory = TemporaryDirectory()

    @Test("setMode and setGroup of an entry never reach through a symbolic link to its target")
    func linksAreNotFollowed() throws {
        let handle = try DirectoryHandle.open(path: directory("shared"), create: true)
        let target = directory("private-file")
        try Data("mine".utf8).write(to: URL(fileURLWithPath: target))
        #expect(chmod(target, 0o600) == 0)
        try FileManager.default.createSymbolicLink(atPath: directory("shared/.b.socket"), withDestinationPath: target)
        var before = stat()
        #expect(stat(target, &before) == 0)
        guard case .failure = handle.setMode(ofEntry: ".b.socket", to: 0o666) else {
            Issue.record("the mode was set through a link")
            return
        }
        // The link itself may take the group (as lchown does); its target never does.
        _ = handle.setGroup(ofEntry: ".b.socket", to: before.st_gid == 0 ? 1 : 0)
        var after = stat()
        #expect(stat(target, &after) == 0)
        #expect(after.st_mode & 0o777 == 0o600)
        #expect(after.st_gid == before.st_gid)
    }
}
