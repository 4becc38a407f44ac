import Foundation
import Testing
import WormholeCLI
import WormholeKit

/// One consumer line of `exercise-postgres-store consume`: `{"id":N,"author":A,"key":K}`.
struct ConsumedTransaction: Decodable, Equatable {
    let id: Int64
    let author: String
    let key: Int64

    static func parse(_ output: String) -> [ConsumedTransaction] {
        output.split(separator: "\n").compactMap { try? JSONDecoder().decode(Self.self, from: Data($0.utf8)) }
    }
}

@Suite(
    "Across hosts: a shared store on PostgreSQL between network namespaces",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .serialized
)
struct StoreAcrossHostsTests {
    @Test(
        "Four writers on four hosts × 500 transactions, two durable consumers: none lost, none twice, in commit order",
        .timeLimit(.minutes(6))
    )
    func fourWritersTwoConsumers() async throws {
        let fixture = try await HostsFixture.make(hosts: 4)
        try await fixture.finish(0, ["exercise-postgres-store", "open"])
        let consumers = try [0, 1].map { host in
            try fixture.run(host, ["exercise-postgres-store", "consume", "--tag", "reader-\(host)", "--count", "2000"])
        }
        for consumer in consumers { #expect(try await blocking { consumer.waitForError(containing: "watching") }) }
        let writers = try (0..<4).map { host in
            try fixture.run(host, ["exercise-postgres-store", "write", "--tag", "writer-\(host)", "--count", "500"])
        }
        for writer in writers {
            let result = try await blocking { writer.finish(timeout: 240) }
            #expect(result.status == 0, "\(result.error)")
        }
        for consumer in consumers {
            let result = try await blocking { consumer.finish(timeout: 120) }
            #expect(result.status == 0, "\(result.error)")
            let seen = ConsumedTransaction.parse(result.output)
            #expect(seen.count == 2000, "none lost")
            #expect(seen.map(\.id) == Array(1...Int64(seen.count)), "in commit order, with no gap and none twice")
            for host in 0..<4 {
                let keys = seen.filter { $0.author == "writer-\(host)" }.map(\.key)
                #expect(keys.count == 500 && keys == keys.sorted(), "each writer's 500, in the order it wrote them")
            }
        }
    }

    @Test(
        "A consumer killed mid-merge gets that transaction again, not the one it merged; one away 1,000 commits catches up",
        .timeLimit(.minutes(5))
    )
    func killedAndAway() async throws {
        let fixture = try await HostsFixture.make(hosts: 2)
        try await fixture.finish(0, ["exercise-postgres-store", "open"])
        // Both consumers register, then go away.
        for tag in ["killed", "away"] {
            try await fixture.finish(1, ["exercise-postgres-store", "consume", "--tag", tag, "--count", "0"])
        }
        let killed = try fixture.run(
            1,
            ["exercise-postgres-store", "consume", "--tag", "killed", "--count", "10", "--crash-at", "3"]
        )
        #expect(try await blocking { killed.waitForError(containing: "watching") })
        try await fixture.finish(0, ["exercise-postgres-store", "write", "--tag", "writer", "--count", "1000"])
        let crashed = try await blocking { killed.finish(timeout: 60) }
        #expect(crashed.status != 0, "it killed itself")
        #expect(ConsumedTransaction.parse(crashed.output).map(\.id) == [1, 2, 3])

        let again = try await fixture.finish(
            1,
            ["exercise-postgres-store", "consume", "--tag", "killed", "--count", "998"]
        )
        #expect(ConsumedTransaction.parse(again.output).map(\.id) == Array(3...1000), "the third again, then on")

        let away = try await fixture.finish(
            1,
            ["exercise-postgres-store", "consume", "--tag", "away", "--count", "1000"],
            timeout: 120
        )
        let caughtUp = ConsumedTransaction.parse(away.output)
        #expect(caughtUp.map(\.id) == Array(1...1000))
        #expect(caughtUp.map(\.key) == caughtUp.map(\.key).sorted())
    }

    @Test(
        "A consumer on another host through server restarts (fast, immediate) and cut links on both hosts: every transaction once, in order",
        .timeLimit(.minutes(8))
    )
    func throughFaults() async throws {
        let fixture = try await HostsFixture.make(hosts: 2)
        let total = 450
        try await fixture.finish(0, ["exercise-postgres-store", "open"])
        let consumer = try fixture.run(
            0,
            ["exercise-postgres-store", "consume", "--tag", "reader", "--count", String(total)]
        )
        #expect(try await blocking { consumer.waitForError(containing: "watching") })
        let writer = try fixture.run(
            1,
            ["exercise-postgres-store", "write", "--tag", "writer", "--count", String(total), "--interval", "20"]
        )
        #expect(await eventuallyAwaiting(timeout: 30) { consumer.outputLines.count >= 30 })
        try await blocking { fixture.server.stop(mode: .fast) }
        try await Task.sleep(for: .seconds(1))
        try await blocking { try fixture.server.start() }
        #expect(await eventuallyAwaiting(timeout: 120) { consumer.outputLines.count >= 120 })
        try await blocking { fixture.server.stop(mode: .immediate) }
        try await Task.sleep(for: .seconds(1))
        try await blocking { try fixture.server.start() }
        #expect(await eventuallyAwaiting(timeout: 120) { consumer.outputLines.count >= 200 })
        // The writer's host loses its link in the middle of its writes: a write under way waits for the link, or
        // fails and is written again. Then the consumer's host.
        #expect(consumer.outputLines.count < total - 100, "the writer still writes when its link is cut")
        try fixture.hosts.cutLink(1)
        try await Task.sleep(for: .seconds(5))
        try fixture.hosts.restoreLink(1)
        #expect(await eventuallyAwaiting(timeout: 120) { consumer.outputLines.count >= 260 })
        try fixture.hosts.cutLink(0)
        try await Task.sleep(for: .seconds(5))
        try fixture.hosts.restoreLink(0)

        let written = try await blocking { writer.finish(timeout: 200) }
        #expect(written.status == 0, "\(written.error)")
        let result = try await blocking { consumer.finish(timeout: 120) }
        #expect(result.status == 0, "\(result.error)")
        let seen = ConsumedTransaction.parse(result.output)
        // A write cut off by a restart may have committed before it failed, and was written again: then there are
        // more transactions than writes, and the consumer stopped at `total`. None is missed, none comes twice.
        #expect(seen.map(\.id) == Array(1...Int64(total)), "in commit order, with no gap and none twice")
        let distinct = try fixture.server.psql("SELECT count(DISTINCT value) FROM exercise.item")
        #expect(distinct == String(total), "every write that returned is in the table")
    }
}

@Suite(
    "The tool on a PostgreSQL store",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .limit(minutes: 3)
)
struct StoreToolTests {
    @Test("wormhole store sql|history|watch|purge --postgres: tables made through the tool are tracked")
    func toolOnPostgres() async throws {
        try await offThePool {
            let url = try requireTestServerURL()
            let group = uniqueGroup("tool")
            let schema = "tool_" + String(UInt32.random(in: 0...UInt32.max))
            let location = [group, "--postgres", url, "--name", "tooled", "--schema", schema]
            let made = try WormholeTool.run(
                ["store", "sql"] + location
                    + ["CREATE SCHEMA \(schema)", "CREATE TABLE note (id int PRIMARY KEY, body text NOT NULL)"]
            )
            #expect(made.status == 0, "\(made.error)")
            let watcher = try RunningTool(["store", "watch"] + location + ["--consumer", "watcher", "--count", "1"])
            #expect(watcher.waitForError(containing: "watching"))
            let inserted = try WormholeTool.run(
                ["store", "sql"] + location + ["--author", "writer", "INSERT INTO note VALUES (1, 'hello')"]
            )
            #expect(inserted.status == 0, "\(inserted.error)")
            let watched = watcher.finish(timeout: 30)
            #expect(watched.status == 0)
            #expect(watched.output.contains(#""author":"writer""#) && watched.output.contains(#""note""#))
            let history = try WormholeTool.run(["store", "history"] + location)
            #expect(history.output.contains(#""note""#))
            let rows = try WormholeTool.run(["store", "sql"] + location + ["--query", "SELECT id, body FROM note"])
            #expect(rows.output.contains(#""body":"hello""#))
            let purged = try WormholeTool.run(["store", "purge"] + location)
            #expect(purged.status == 0 && purged.output.contains("purged"))
        }
    }

    @Test(
        "wormhole demo store --hosts: two hosts see each other's increments; the counter ends at their sum",
        .timeLimit(.minutes(3))
    )
    func demoStoreHosts() async throws {
        if let reason = NetworkHosts.unavailableReason() { try Test.cancel("No network namespaces here: \(reason)") }
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel("No PostgreSQL here: \(reason)") }
        let result = try await blocking { try WormholeTool.run(["demo", "store", "--hosts"], timeout: 150) }
        #expect(result.status == 0, "\(result.error)")
        #expect(result.output.contains("The counter is 6 (6 increments on two hosts)"))
        #expect(result.output.contains("received transaction") && result.output.contains("from widget"))
    }
}
