import Foundation
import Testing
import WormholeCLI
import WormholeKit

/// Hosts as network namespaces, each joined to a PostgreSQL server of the test's own by a veth pair: the `wormhole`
/// tool and the harness run inside the hosts, reach the server only through their link, and the test cuts links,
/// restarts the server and kills processes.
final class HostsFixture: Sendable {
    let hosts: NetworkHosts
    let server: LocalPostgresServer
    let group = uniqueGroup("hosts")
    let temporary = TemporaryDirectory()

    /// Makes `count` hosts and the server, off the cooperative pool; skips the test (cancelled, with the reason)
    /// where this machine cannot make hosts or run a server.
    static func make(hosts count: Int) async throws -> HostsFixture {
        if let reason = NetworkHosts.unavailableReason() { try Test.cancel("No network namespaces here: \(reason)") }
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel("No PostgreSQL here: \(reason)") }
        return try await blocking { try HostsFixture(hosts: count) }
    }

    private init(hosts count: Int) throws {
        hosts = try NetworkHosts(count: count)
        // Durable (synchronous commits): an immediate shutdown is a crash, and a commit acknowledged before its WAL
        // reached the disk would be lost by the server, not by the engine.
        server = try LocalPostgresServer(listenAddresses: ["127.0.0.1"] + hosts.serverAddresses, durable: true)
    }

    deinit {
        server.close()
        hosts.close()
    }

    /// The server as host `index` reaches it: through its own link.
    func url(_ index: Int) -> String { server.url(host: hosts.serverAddress(index)) }

    /// Starts `wormhole ARGUMENTS --postgres URL --group G` (or the harness, for its commands) inside host `index`.
    func run(_ index: Int, _ arguments: [String]) throws -> RunningTool {
        try RunningTool(
            arguments + ["--postgres", url(index), "--group", group],
            launcher: ["/usr/sbin/ip", "netns", "exec", hosts.namespace(index)]
        )
    }

    /// Runs a command to its end inside host `index`, off the cooperative pool; records an issue when it fails.
    @discardableResult
    func finish(_ index: Int, _ arguments: [String], timeout: Double = 60) async throws -> WormholeTool.Result {
        let process = try run(index, arguments)
        let result = try await blocking { process.finish(timeout: timeout) }
        #expect(result.status == 0, "\(arguments) on host \(index) failed: \(result.error)")
        return result
    }
}

/// The indexes in the JSON lines `{"index":N,"writer":W}` a consumer printed.
func consumedIndexes(_ lines: [String]) -> [Int] {
    lines.compactMap { line in
        (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["index"] as? Int
    }
}

@Suite(
    "Across hosts: the PostgreSQL engine between network namespaces",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .serialized
)
struct AcrossHostsTests {
    @Test(
        "Processes on two hosts pass, enqueue and consume, request and respond, watch a suite, transfer 100 MiB",
        .timeLimit(.minutes(5))
    )
    func everyModeAcrossHosts() async throws {
        let fixture = try await HostsFixture.make(hosts: 2)

        // Mailbox: a listener on host 0, messages passed on host 1.
        let listener = try fixture.run(0, ["listen", "status", "--count", "1", "--timeout", "60"])
        #expect(try await blocking { listener.waitUntilListening() })
        try await fixture.finish(1, ["send", "status", #"{"from":"host 1"}"#])
        #expect((try await blocking { listener.finish(timeout: 60) }).output.contains("host 1"))

        // Queue: ten messages enqueued on host 1, consumed in order on host 0.
        for index in 0..<10 { try await fixture.finish(1, ["enqueue", "jobs", #"{"index":\#(index)}"#]) }
        let consumed = try await fixture.finish(
            0,
            ["consume", "jobs", "--consumer", "worker", "--count", "10", "--timeout", "60"]
        )
        #expect(consumedIndexes(consumed.lines) == Array(0..<10))

        // Request and reply: a responder on host 0 answers with `cat`, a request from host 1.
        let responder = try fixture.run(0, ["respond", "echo", "--exec", "cat", "--count", "1"])
        #expect(try await blocking { responder.waitForError(containing: "responding to echo") })
        let reply = try await fixture.finish(1, ["request", "echo", #"{"question":42}"#])
        #expect(reply.output.contains("42"))
        _ = (try await blocking { responder.finish(timeout: 30) })

        // Suite: a watcher on host 0 sees host 1's change, with its sender.
        let watcher = try fixture.run(0, ["defaults", "watch", "prefs", "--count", "1", "--timeout", "60"])
        #expect(try await blocking { watcher.waitForError(containing: "watching prefs") })
        try await fixture.finish(1, ["defaults", "set", "prefs", "color", #""blue""#])
        #expect((try await blocking { watcher.finish(timeout: 60) }).output.contains("blue"))

        // Transfer: 100 MiB from host 1 to host 0, received whole, in chunks on both sides.
        let source = fixture.temporary("big.bin")
        let destination = fixture.temporary("received")
        try Data(count: 0).write(to: URL(fileURLWithPath: source))
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: source))
        // 1 MiB of random bytes, written 100 times with the chunk's number at its start.
        var generator = SystemRandomNumberGenerator()
        var block = [UInt8](repeating: 0, count: 1 << 20)
        for index in stride(from: 0, to: block.count, by: 8) {
            withUnsafeBytes(of: generator.next()) { block.replaceSubrange(index..<index + 8, with: $0) }
        }
        for chunk in 0..<100 {
            block[0] = UInt8(chunk)
            try handle.write(contentsOf: block)
        }
        try handle.close()
        let sent = try fixture.run(1, ["exercise", "transfer-send", "--identifier", "files", "--into", source])
        let received = try await fixture.finish(
            0,
            [
                "transfer", "receive", "files", "--consumer", "r", "--into", destination, "--count", "1", "--timeout",
                "240",
            ],
            timeout: 260
        )
        let sender = (try await blocking { sent.finish(timeout: 240) })
        #expect(sender.status == 0, "\(sender.error)")
        let peak =
            Int(
                sender.output.split(separator: "=").last.map {
                    String($0).trimmingCharacters(in: .whitespacesAndNewlines)
                } ?? ""
            ) ?? -1
        #expect(peak > 0 && peak < 80 * 1024, "the sender held \(peak) KiB at its peak: the file must stream")
        let path = destination + "/big.bin"
        #expect(received.output.contains(path))
        #expect(FileManager.default.contentsEqual(atPath: source, andPath: path))
    }

    @Test(
        "A queue across server restarts (fast, then immediate) and a cut link: nothing lost, duplicates only where a producer retried",
        .timeLimit(.minutes(5))
    )
    func queueThroughFaults() async throws {
        let fixture = try await HostsFixture.make(hosts: 2)
        let total = 300
        let consumer = try fixture.run(
            0,
            ["consume", "jobs", "--consumer", "worker", "--count", String(total + 50), "--timeout", "200"]
        )
        #expect(try await blocking { consumer.waitForError(containing: "consuming jobs") })
        let producer = try fixture.run(
            1,
            [
                "exercise", "enqueue-through-faults", "--identifier", "jobs", "--count", String(total), "--interval",
                "20",
            ]
        )
        var recoveries: [String] = []
        // Waits for the consumer to get `more` messages after a fault ended; records how long that took.
        func recovered(after fault: String, from start: ContinuousClock.Instant) async {
            let before = consumer.outputLines.count
            let back = await eventuallyAwaiting(timeout: 60) { consumer.outputLines.count > before }
            #expect(back, "the consumer did not come back after \(fault)")
            recoveries.append("\(fault): \(ContinuousClock.now - start)")
        }
        #expect(await eventuallyAwaiting(timeout: 30) { consumer.outputLines.count >= 30 })
        try await blocking { fixture.server.stop(mode: .fast) }
        try await Task.sleep(for: .seconds(1))
        try await blocking { try fixture.server.start() }
        await recovered(after: "server restart (fast)", from: .now)

        #expect(await eventuallyAwaiting(timeout: 30) { consumer.outputLines.count >= 120 })
        try await blocking { fixture.server.stop(mode: .immediate) }
        try await Task.sleep(for: .seconds(1))
        try await blocking { try fixture.server.start() }
        await recovered(after: "server restart (immediate)", from: .now)

        #expect(await eventuallyAwaiting(timeout: 30) { consumer.outputLines.count >= 200 })
        try fixture.hosts.cutLink(0)
        try await Task.sleep(for: .seconds(5))
        try fixture.hosts.restoreLink(0)
        await recovered(after: "consumer host's link cut for 5 s", from: .now)

        let produced = (try await blocking { producer.finish(timeout: 200) })
        #expect(produced.status == 0, "\(produced.error)")
        let retried = Int(produced.lines.last?.split(separator: " ").last ?? "") ?? -1
        #expect(await eventuallyAwaiting(timeout: 60) { Set(consumedIndexes(consumer.outputLines)).count == total })
        consumer.kill()
        let indexes = consumedIndexes((try await blocking { consumer.finish(timeout: 30) }).lines)
        #expect(Set(indexes) == Set(0..<total), "every message acknowledged by the producer arrives")
        #expect(indexes.count - total <= retried, "a duplicate only where the producer retried (\(retried) retries)")
        #expect(indexes == indexes.sorted() || indexes.count > total, "in commit order")
        print("Across hosts, recovery after each fault: \(recoveries.joined(separator: "; ")); retries \(retried)")
    }

    @Test(
        "A consumer host killed mid-stream: its successor gets every message, at most the one in flight again",
        .timeLimit(.minutes(3))
    )
    func consumerHostKilled() async throws {
        let fixture = try await HostsFixture.make(hosts: 3)
        try await fixture.finish(1, ["exercise", "enqueue", "--identifier", "jobs", "--count", "200"])
        // On host 0, a consumer that dies (SIGKILL) while handling its second message.
        let victim = try fixture.run(0, ["exercise", "consume-then-crash", "--identifier", "jobs", "--tag", "worker"])
        _ = (try await blocking { victim.finish(timeout: 60) })
        #expect(victim.outputLines == ["handled 0", "handled 1"])
        // On host 2, the same durable consumer takes over.
        let successor = try await fixture.finish(
            2,
            ["consume", "jobs", "--consumer", "worker", "--count", "199", "--timeout", "60"]
        )
        #expect(consumedIndexes(successor.lines) == Array(1..<200), "the message in flight comes back, once")
    }
}
