import CWormholeSystem
import Foundation
import Testing
import WormholeKit

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What can be proven here of the Apple-platform design, which no machine of this project can compile: the framed
/// stream connections that stand in for `SOCK_SEQPACKET` (XNU's local domain has none), run on Linux by
/// `WORMHOLE_FRAMED_CONNECTIONS=1`, and queue consumers that hold no lock while they wait (iOS ends a suspended app
/// holding one in a shared container, `0xdead10cc`).
@Suite("The Apple-platform design, where Linux can run it", .limit(minutes: 2))
struct DarwinDesignTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }

    /// A connected pair of stream sockets, as a framed connection is.
    func streamPair() throws -> (Int32, Int32) {
        var descriptors: [Int32] = [-1, -1]
        #if canImport(Glibc)
        let type = Int32(SOCK_STREAM.rawValue)
        #else
        let type = SOCK_STREAM
        #endif
        try #require(socketpair(AF_UNIX, type, 0, &descriptors) == 0, "socketpair failed: errno \(errno)")
        return (descriptors[0], descriptors[1])
    }

    @Test("Frames keep their boundaries, a half frame is not read until whole, and a closed peer reads as 0")
    func framesOnAStream() throws {
        let (sender, receiver) = try streamPair()
        defer { close(sender) }
        var buffer = [UInt8](repeating: 0, count: 256)
        func receive(wait: Bool) -> Int {
            buffer.withUnsafeMutableBytes {
                Int(cwormhole_receive_frame(receiver, $0.baseAddress, $0.count, wait ? 1 : 0))
            }
        }
        // Two packets, sent in two parts each, arrive as two packets.
        for text in ["first", "second packet"] {
            let head = Array("h:".utf8)
            let body = Array(text.utf8)
            let sent = head.withUnsafeBytes { h in
                body.withUnsafeBytes { b in
                    cwormhole_send_frame(sender, h.baseAddress, h.count, b.baseAddress, b.count, 1)
                }
            }
            #expect(sent == head.count + body.count)
        }
        #expect(receive(wait: false) == 7)
        #expect(String(decoding: buffer[..<7], as: UTF8.self) == "h:first")
        #expect(receive(wait: false) == 15)
        #expect(String(decoding: buffer[..<15], as: UTF8.self) == "h:second packet")
        // Nothing waiting: EAGAIN, nothing consumed.
        #expect(receive(wait: false) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
        // A frame's length and half its bytes, as a peer stopped in the middle of a send leaves them: not read yet.
        let half: [UInt8] = [10, 0, 0, 0] + Array("hello".utf8)
        #expect(write(sender, half, half.count) == half.count)
        #expect(receive(wait: false) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
        let rest = Array("world".utf8)
        #expect(write(sender, rest, rest.count) == rest.count)
        #expect(receive(wait: false) == 10)
        #expect(String(decoding: buffer[..<10], as: UTF8.self) == "helloworld")
        // A length past the buffer is refused, so that the connection is closed rather than read as garbage.
        let huge: [UInt8] = [0, 2, 0, 0]
        #expect(write(sender, huge, huge.count) == 4)
        #expect(receive(wait: false) == -1 && errno == EMSGSIZE)
        close(receiver)
        // The other way round: a closed peer reads as 0.
        let (a, b) = try streamPair()
        close(a)
        let closed = buffer.withUnsafeMutableBytes { Int(cwormhole_receive_frame(b, $0.baseAddress, $0.count, 1)) }
        #expect(closed == 0)
        close(b)
    }

    @Test("Requests and replies between processes over framed stream connections, as on Apple platforms")
    func framedRequestsAcrossProcesses() async throws {
        let framed = ["WORMHOLE_FRAMED_CONNECTIONS": "1"]
        try await offThePool {
            let responder = try RunningTool(
                ["respond"] + location + ["lookup", "--exec", #"sed 's/"term"/"result"/'"#, "--count", "3"],
                environment: framed
            )
            defer { responder.kill() }
            #expect(responder.waitForError(containing: "responding to"))
            // The socket is a stream socket: the responder really runs the framed path.
            let live = directory("wormhole/.live")
            let names = try FileManager.default.contentsOfDirectory(atPath: live).filter { $0.contains(".r.") }
            #expect(names.count == 1, "\(names)")
            for term in ["a", "b", "c"] {
                let process = try RunningTool(
                    ["request"] + location + ["lookup", #"{"term":"\#(term)"}"#, "--timeout", "10"],
                    environment: framed
                )
                let result = process.finish(timeout: 20)
                #expect(result.status == 0, "\(result.error)")
                #expect(result.output.contains(#""result":"\#(term)""#), "\(result.output)")
            }
        }
    }

    @Test("A consumer waiting on a quiet queue holds no lock, and is not dropped while it runs past its retention")
    func waitingConsumerHoldsNoLock() async throws {
        try await offThePool {
            let (queue, consumer, handled, path) = try startWorker()
            defer { consumer.cancel() }
            // Waiting: no lock on the position file, at any of a few looks.
            for _ in 0..<5 {
                #expect(!Self.isLocked(path), "the waiting consumer holds a lock on \(path)")
                usleep(100_000)
            }
            // Past the retention with nothing to do, while another wormhole reclaims: still registered.
            usleep(3_500_000)
            try Wormhole(directory: directory("wormhole")).queue("jobs", retention: .seconds(2)).reclaimSpace()
            #expect(FileManager.default.fileExists(atPath: path), "a running consumer was dropped")
            try queue.enqueue(2)
            #expect(eventually { handled.values == [1, 2] })
        }
    }

    @Test("A consumer whose position was dropped while its process was away registers again at its next message")
    func droppedConsumerRegistersAgain() async throws {
        try await offThePool {
            let (queue, consumer, handled, path) = try startWorker()
            defer { consumer.cancel() }
            // As reclaiming does to a consumer not seen within the retention.
            try FileManager.default.removeItem(atPath: path)
            usleep(1_500_000)  // a mark finds it gone
            try queue.enqueue(2)
            #expect(eventually { handled.values == [1, 2] })
            #expect(eventually { FileManager.default.fileExists(atPath: path) }, "not registered again")
            let status = try queue.status()
            #expect(status.consumers.contains { $0.name == "worker" }, "\(status)")
        }
    }

    /// Consumer `worker` of queue `jobs` (a retention of 2 s: it marks itself every second, with no lock kept between
    /// marks), once it handled a first message; with what it handled and its position file.
    func startWorker() throws -> (WormholeQueue, QueueConsumer, Collector<Int>, String) {
        let queue = try Wormhole(directory: directory("wormhole")).queue("jobs", retention: .seconds(2))
        let handled = Collector<Int>()
        let consumer = try queue.consume(consumer: "worker", as: Int.self) { message in
            handled.append(message.value)
        }
        try queue.enqueue(1)
        #expect(eventually { handled.values == [1] })
        return (queue, consumer, handled, try consumerFile())
    }

    /// The position file of consumer `worker` of queue `jobs`, wherever the directory format keeps it.
    func consumerFile() throws -> String {
        let root = directory("wormhole")
        let enumerator = FileManager.default.enumerator(atPath: root)
        while let entry = enumerator?.nextObject() as? String {
            if entry.hasSuffix("/worker"), entry.contains("jobs") { return root + "/" + entry }
        }
        throw WormholeError(.ioFailure, "no position file of consumer worker under \(root)")
    }

    /// Whether anyone holds a `flock` or POSIX lock on the file at `path` (`/proc/locks`, Linux only).
    static func isLocked(_ path: String) -> Bool {
        #if os(Linux) || os(Android)
        var raw = stat()
        guard stat(path, &raw) == 0,
            let text = try? String(contentsOfFile: "/proc/locks", encoding: .utf8)
        else { return false }
        let device = UInt64(raw.st_dev)
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & 0xffff_f000)
        let minor = (device & 0xff) | ((device >> 12) & 0xffff_ff00)
        let place = String(format: "%02x:%02x:%llu", major, minor, UInt64(raw.st_ino))
        return text.split(separator: "\n").contains { $0.contains(" " + place + " ") }
        #else
        return false
        #endif
    }
}
