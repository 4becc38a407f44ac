import Foundation
import Testing

@testable import WormholeKit

/// What a hostile process could put on a transfer channel, and a destination on another file system.
@Suite("File transfers: names that would escape, and other file systems", .limit(minutes: 3))
struct TransferSafetyTests {
    let directory = TemporaryDirectory()
    var path: String { directory("wormhole") }

    @Test("A transfer whose name or id would leave its directory is refused and nothing is written outside")
    func transferNamesCannotEscape() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: path)
            let transfers = try wormhole.transfers("files")
            let inbox = directory("inbox")
            // What a hostile process could enqueue by hand on the channel's queue.
            let queue = try wormhole.queue("files.transfers")
            for (id, name) in [
                (UUID().uuidString.lowercased(), "../escaped"), ("../../escaped", "report.pdf"),
                (UUID().uuidString.lowercased(), "/tmp/escaped"),
            ] {
                try queue.enqueue(FileTransfer(id: id, name: name, size: 1, metadata: [:], sender: "mallory"))
            }
            let errors = Collector<WormholeError.Code>()
            let received = Collector<String>()
            let receiver = try transfers.receive(
                consumer: "viewer",
                into: inbox,
                on: .notifierThread,
                errorHandler: { errors.append($0.code) }
            ) { file in received.append(file.path) }
            #expect(eventually { errors.count == 3 })
            receiver.cancel()
            #expect(errors.values.allSatisfy { $0 == .invalidIdentifier })
            #expect(received.values.isEmpty)
            #expect(!FileManager.default.fileExists(atPath: directory("escaped")))
            #expect(!FileManager.default.fileExists(atPath: "/tmp/escaped"))
        }
    }

    @Test(
        "A transfer received on another file system is copied whole under its name, and nothing else is left",
        .enabled(if: FileManager.default.fileExists(atPath: "/dev/shm"), "needs /dev/shm, another file system")
    )
    func deliveryAcrossFileSystems() async throws {
        try await offThePool {
            let inbox = "/dev/shm/wormhole-test-inbox-\(UUID().uuidString)"
            defer { try? FileManager.default.removeItem(atPath: inbox) }
            let bytes = Data((0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
            let source = directory("report.bin")
            try bytes.write(to: URL(fileURLWithPath: source))
            let transfers = try Wormhole(directory: path).transfers("files")
            try transfers.send(file: source)
            let received = Collector<String>()
            let receiver = try transfers.receive(consumer: "viewer", into: inbox, on: .notifierThread) {
                received.append($0.path)
            }
            #expect(eventually { received.count == 1 })
            receiver.cancel()
            #expect(received.values == [inbox + "/report.bin"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: inbox + "/report.bin")) == bytes)
            #expect(try FileManager.default.contentsOfDirectory(atPath: inbox) == ["report.bin"])
        }
    }
}
