import Foundation
import Testing

@testable import WormholeKit

/// File transfers between real processes.
@Suite("File transfers", .limit(minutes: 3))
struct TransferTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }
    func makeTransfers() throws -> WormholeTransfers {
        try Wormhole(directory: directory("wormhole")).transfers("files")
    }

    func makeFile(_ name: String, size: Int) throws -> (path: String, data: Data) {
        let data = Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        let path = directory(name)
        try data.write(to: URL(fileURLWithPath: path))
        return (path, data)
    }

    @Test("A file sent by another process, while nobody received, reaches the receiver once, with its metadata")
    func sendThenReceive() async throws {
        try await offThePool {
            let (path, data) = try makeFile("report.pdf", size: 3_000_000)
            let sent = try WormholeTool.run(
                ["transfer", "send"] + location + ["files", path, "--meta", "kind=report"]
            )
            #expect(sent.status == 0, "\(sent.error)")
            #expect(sent.error.contains("100%"), "a progress bar")
            let received = Collector<ReceivedFile>()
            let receiver = try makeTransfers().receive(consumer: "viewer", into: directory("inbox")) {
                received.append($0)
            }
            #expect(eventually { received.count == 1 })
            receiver.cancel()
            let file = try #require(received.values.first)
            #expect(file.path == directory("inbox/report.pdf"))
            #expect(file.transfer.metadata == ["kind": "report"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: file.path)) == data)
            #expect(permissions(file.path) == 0o600)
            #expect(try makeTransfers().pendingTransferIDs().isEmpty)
            // The same consumer never gets it again; the original stays where it was.
            let again = Collector<ReceivedFile>()
            let second = try makeTransfers().receive(consumer: "viewer", into: directory("inbox")) { again.append($0) }
            usleep(200_000)
            #expect(again.values.isEmpty)
            second.cancel()
            #expect(FileManager.default.fileExists(atPath: path))
        }
    }

    @Test(
        "A 1 GiB file is streamed, not read into memory",
        .enabled(if: ProcessInfo.processInfo.environment["WORMHOLE_SKIP_LARGE"] == nil)
    )
    func largeFile() async throws {
        try await offThePool {
            let path = directory("large.bin")
            let file = open(path, O_WRONLY | O_CREAT, 0o600)
            #expect(ftruncate(file, 1 << 30) == 0)  // sparse: quick to make, a real gibibyte to copy
            close(file)
            let sent = try WormholeTool.run(
                ["exercise", "transfer-send", "--identifier", "files", "--into", path] + location,
                timeout: 120
            )
            #expect(sent.status == 0, "\(sent.error)")
            // The sender's own peak resident memory stayed far below the file's size.
            let peak = Int(sent.lines.last?.split(separator: "=").last ?? "") ?? .max
            #expect(peak < 256 * 1024, "peak resident memory of the sender: \(peak) KiB")
            let received = Collector<ReceivedFile>()
            let receiver = try makeTransfers().receive(consumer: "viewer", into: directory("inbox")) {
                received.append($0)
            }
            #expect(eventually(timeout: 60) { received.count == 1 })
            receiver.cancel()
            var status = stat()
            stat(directory("inbox/large.bin"), &status)
            #expect(status.st_size == 1 << 30)
            unlink(directory("inbox/large.bin"))
        }
    }

    @Test("A transfer cancelled before it is received is passed over; the next one arrives")
    func cancel() async throws {
        try await offThePool {
            let transfers = try makeTransfers()
            let first = try transfers.send(file: try makeFile("a.txt", size: 10).path)
            _ = try transfers.send(file: try makeFile("b.txt", size: 20).path)
            #expect(try transfers.cancel(first.id))
            let received = Collector<String>()
            let errors = Collector<String>()
            let receiver = try transfers.receive(
                consumer: "viewer",
                into: directory("inbox"),
                errorHandler: { errors.append($0.message) }
            ) {
                received.append($0.transfer.name)
            }
            #expect(eventually { received.values == ["b.txt"] })
            #expect(errors.values.first?.contains("cancelled") == true)
            receiver.cancel()
            #expect(try !transfers.cancel(first.id), "already gone")
        }
    }

    @Test("A receiver killed after moving a file gets it again on restart, without a second copy")
    func receiverKilled() async throws {
        try await offThePool {
            let transfers = try makeTransfers()
            let (path, data) = try makeFile("photo.jpg", size: 1000)
            try transfers.send(file: path)
            let crashing = try WormholeTool.run(
                [
                    "exercise", "transfer-receive-then-crash", "--identifier", "files", "--tag", "viewer", "--into",
                    directory("inbox"),
                ]
                    + location
            )
            #expect(crashing.status != 0)
            #expect(crashing.lines == ["moved \(directory("inbox/photo.jpg"))"])
            let received = Collector<String>()
            let receiver = try transfers.receive(consumer: "viewer", into: directory("inbox")) {
                received.append($0.path)
            }
            #expect(eventually { received.values == [directory("inbox/photo.jpg")] })
            receiver.cancel()
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory("inbox")) == ["photo.jpg"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: directory("inbox/photo.jpg"))) == data)
        }
    }

    @Test("A sender killed mid-copy delivers nothing; its partial copy can be removed")
    func senderKilled() async throws {
        try await offThePool {
            let path = directory("big.bin")
            let file = open(path, O_WRONLY | O_CREAT, 0o600)
            #expect(ftruncate(file, 1 << 30) == 0)
            close(file)
            let sender = try RunningTool(["transfer", "send"] + location + ["files", path])
            #expect(
                eventually {
                    (try? FileManager.default.contentsOfDirectory(atPath: directory("wormhole/files.files")))?.isEmpty
                        == false
                }
            )
            sender.kill()
            _ = sender.finish()
            let transfers = try makeTransfers()
            #expect(try transfers.pendingTransferIDs().isEmpty)
            #expect(try transfers.queue.status().endOffset == 0, "nothing was queued")
            try transfers.removeAbandonedCopies(olderThan: .seconds(-1))
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory("wormhole/files.files")).isEmpty)
        }
    }

    @Test("list and cancel from the command line")
    func commandLine() async throws {
        try await offThePool {
            let (path, _) = try makeFile("a.txt", size: 5)
            let id = try WormholeTool.run(["transfer", "send"] + location + ["files", path]).lines.last ?? ""
            #expect(try WormholeTool.run(["transfer", "list"] + location + ["files"]).lines == [id])
            #expect(try WormholeTool.run(["transfer", "cancel"] + location + ["files", id]).status == 0)
            #expect(try WormholeTool.run(["transfer", "cancel"] + location + ["files", id]).status == 1)
            #expect(try WormholeTool.run(["transfer", "list"] + location + ["files"]).lines == [])
        }
    }
}
