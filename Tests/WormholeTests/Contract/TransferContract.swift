import Foundation
import Testing
import WormholeKit

/// The file-transfer contract, for every engine (``TransferStaging`` and the ``QueueLog`` of transfers).
///
/// A file sent is copied in chunks (progress reported up to the whole file), queued, and received by each consumer
/// once, in order, with its name and metadata and exactly its bytes, across restarts of either side: a receiver
/// restarted under the same name never gets a file twice. A transfer cancelled before any receiver took it is never
/// delivered: receivers report it to their error handler and pass over it.
@Suite("Contract: file transfers", .limit(minutes: 3))
struct TransferContract {
    /// Writes `count` random bytes to `path`.
    static func randomFile(_ path: String, count: Int) throws -> Data {
        var generator = SystemRandomNumberGenerator()
        var bytes = [UInt8](repeating: 0, count: count)
        for index in stride(from: 0, to: count, by: 8) {
            withUnsafeBytes(of: generator.next() as UInt64) { random in
                for offset in 0..<min(8, count - index) { bytes[index + offset] = random[offset] }
            }
        }
        let data = Data(bytes)
        try data.write(to: URL(fileURLWithPath: path))
        return data
    }

    static func contents(of directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
    }

    @Test(
        "A 3 MiB file arrives once, whole, with its metadata; progress reaches 1.0",
        arguments: EngineKind.underTest
    )
    func largeFile(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let source = fixture.scratch("report.bin")
            let original = try Self.randomFile(source, count: 3 << 20)
            let inbox = fixture.scratch("inbox")

            let received = Collector<ReceivedFile>()
            let errors = Collector<WormholeError>()
            let receiver = try fixture.wormhole("viewer").transfers("exports").receive(
                consumer: "viewer",
                into: inbox,
                errorHandler: { errors.append($0) }
            ) { received.append($0) }

            let exports = try fixture.wormhole("app").transfers("exports")
            let progress = Collector<TransferProgress>()
            let transfer = try exports.send(
                file: source,
                metadata: ["kind": "report", "owner": "app"],
                progress: { progress.append($0) }
            )
            #expect(transfer.size == UInt64(original.count))
            #expect(transfer.name == "report.bin")
            let fractions = progress.values.map(\.fraction)
            #expect(fractions.last == 1.0, "progress reaches the whole file")
            #expect(zip(fractions, fractions.dropFirst()).allSatisfy { $0 <= $1 }, "progress only grows: \(fractions)")
            #expect(progress.values.allSatisfy { $0.totalBytes == UInt64(original.count) })

            #expect(eventually { received.count >= 1 })
            let file = try #require(received.values.first)
            #expect(file.transfer.id == transfer.id)
            #expect(file.transfer.metadata == ["kind": "report", "owner": "app"])
            #expect(file.transfer.sender == "app")
            #expect(file.transfer.size == UInt64(original.count))
            #expect(file.path == inbox + "/report.bin")
            #expect(try Data(contentsOf: URL(fileURLWithPath: file.path)) == original, "exactly the bytes sent")
            #expect(FileManager.default.fileExists(atPath: source), "the sender's file stays where it is")

            // A second file marks the end: the first is not delivered again before it.
            let marker = fixture.scratch("marker.txt")
            try Data("end".utf8).write(to: URL(fileURLWithPath: marker))
            try exports.send(file: marker)
            #expect(eventually { received.values.last?.transfer.name == "marker.txt" })
            #expect(received.values.map(\.transfer.name) == ["report.bin", "marker.txt"])
            #expect(Self.contents(of: inbox) == ["marker.txt", "report.bin"])
            #expect(try exports.pendingTransferIDs().isEmpty)
            #expect(errors.values.isEmpty)
            receiver.cancel()
        }
    }

    @Test(
        "A transfer cancelled before any receiver starts is not delivered, and is reported",
        arguments: EngineKind.underTest
    )
    func cancelledTransfer(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let exports = try fixture.wormhole("app").transfers("exports")
            let first = fixture.scratch("first.txt")
            let second = fixture.scratch("second.txt")
            try Data("first".utf8).write(to: URL(fileURLWithPath: first))
            try Data("second".utf8).write(to: URL(fileURLWithPath: second))

            let cancelled = try exports.send(file: first)
            #expect(try exports.pendingTransferIDs() == [cancelled.id])
            #expect(try exports.cancel(cancelled.id))
            #expect(try exports.pendingTransferIDs().isEmpty)
            #expect(try !exports.cancel(cancelled.id), "already cancelled")
            let kept = try exports.send(file: second)
            #expect(try exports.pendingTransferIDs() == [kept.id])

            let inbox = fixture.scratch("inbox")
            let received = Collector<ReceivedFile>()
            let errors = Collector<WormholeError>()
            let receiver = try fixture.wormhole("viewer").transfers("exports").receive(
                consumer: "viewer",
                into: inbox,
                errorHandler: { errors.append($0) }
            ) { received.append($0) }
            #expect(eventually { received.count >= 1 })
            #expect(received.values.map(\.transfer.id) == [kept.id])
            #expect(Self.contents(of: inbox) == ["second.txt"])
            #expect(errors.count == 1, "the cancelled transfer is reported, before the next one is delivered")
            #expect(errors.values.first?.message.contains(cancelled.id) == true)
            #expect(try exports.pendingTransferIDs().isEmpty)
            receiver.cancel()
        }
    }

    @Test("files(): an AsyncSequence of the files received", arguments: EngineKind.underTest)
    func filesSequence(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let exports = try fixture.wormhole("app").transfers("exports")
        let inbox = fixture.scratch("inbox")
        let source = fixture.scratch("note.txt")
        try Data("hello".utf8).write(to: URL(fileURLWithPath: source))
        let files = try fixture.wormhole("viewer").transfers("exports").files(consumer: "viewer", into: inbox)
        let sent = try exports.send(file: source, name: "greeting.txt", metadata: ["lang": "en"])

        var iterator = files.makeAsyncIterator()
        let file = try #require(try await iterator.next())
        #expect(file.transfer.id == sent.id)
        #expect(file.transfer.name == "greeting.txt")
        #expect(file.transfer.metadata == ["lang": "en"])
        #expect(file.path == inbox + "/greeting.txt")
        #expect(try Data(contentsOf: URL(fileURLWithPath: file.path)) == Data("hello".utf8))
    }

    @Test("A receiver restarted under its name does not get a file twice", arguments: EngineKind.underTest)
    func restartedReceiver(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let exports = try fixture.wormhole("app").transfers("exports")
            let inbox = fixture.scratch("inbox")
            var sources: [String: Data] = [:]
            for name in ["one.bin", "two.bin", "three.bin"] {
                sources[name] = try Self.randomFile(fixture.scratch(name), count: 4096)
            }

            let received = Collector<ReceivedFile>()
            try exports.send(file: fixture.scratch("one.bin"))
            let first = try fixture.wormhole("viewer").transfers("exports").receive(consumer: "viewer", into: inbox) {
                received.append($0)
            }
            #expect(eventually { received.count >= 1 })
            first.cancel()
            #expect(first.isCancelled)

            // Away: another file.
            try exports.send(file: fixture.scratch("two.bin"))
            let second = try fixture.wormhole("viewer-again").transfers("exports").receive(
                consumer: "viewer",
                into: inbox
            ) {
                received.append($0)
            }
            #expect(eventually { received.count >= 2 })
            try exports.send(file: fixture.scratch("three.bin"))  // and one live, after catching up
            #expect(eventually { received.values.last?.transfer.name == "three.bin" })

            #expect(
                received.values.map(\.transfer.name) == ["one.bin", "two.bin", "three.bin"],
                "each file once, in order"
            )
            #expect(Self.contents(of: inbox) == ["one.bin", "three.bin", "two.bin"], "no second copy of any file")
            for file in received.values {
                #expect(try Data(contentsOf: URL(fileURLWithPath: file.path)) == sources[file.transfer.name])
            }
            second.cancel()
        }
    }
}
