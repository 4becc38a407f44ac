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

@Suite("Across hosts: a shared store on PostgreSQL between network namespaces", .serialized)
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
}
