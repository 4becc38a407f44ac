import Foundation
import Testing

@testable import WormholeKit

/// A delivery's steps taken up again from each state a killed receiver can leave, cancellations against them, and
/// files planted in the staging area (a review of the transfer mode found each of these wrong).
@Suite("Transfer deliveries", .limit(minutes: 2))
struct TransferDeliveryTests {
    let directory = TemporaryDirectory()

    func makeTransfers() throws -> WormholeTransfers {
        try Wormhole(directory: directory("wormhole")).transfers("files")
    }

    /// The channel's staging directory, as a receiver's delivery sees it.
    var staging: String { directory("wormhole/files.files") }

    func makeFile(_ name: String, size: Int) throws -> (path: String, data: Data) {
        let data = Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 17 &+ 3) })
        let path = directory(name)
        try data.write(to: URL(fileURLWithPath: path))
        return (path, data)
    }

    /// Receives until `count` files or reports came, then stops: the paths received and the errors' messages.
    func receive(
        _ transfers: WormholeTransfers,
        into inbox: String,
        count: Int
    ) throws -> (paths: [String], errors: [String]) {
        let received = Collector<String>()
        let errors = Collector<String>()
        let receiver = try transfers.receive(
            consumer: "viewer",
            into: inbox,
            on: .notifierThread,
            errorHandler: { errors.append($0.message) }
        ) { received.append($0.path) }
        #expect(eventually { received.count + errors.count >= count })
        receiver.cancel()
        return (received.values, errors.values)
    }

    /// Writes the marker a receiver writes before it moves a file.
    func writeMarker(_ id: String, recording path: String) throws {
        try Data(path.utf8).write(to: URL(fileURLWithPath: staging + "/\(id).delivered"))
    }

    /// A file `name` of `size` bytes sent, and what a receiver killed right after it recorded the delivery leaves: the
    /// inbox, and the marker naming the file in it.
    func interruptedDelivery(
        of name: String,
        size: Int
    ) throws -> (transfers: WormholeTransfers, transfer: FileTransfer, data: Data, inbox: String) {
        let transfers = try makeTransfers()
        let (path, data) = try makeFile(name, size: size)
        let transfer = try transfers.send(file: path)
        let inbox = directory("inbox")
        try FileManager.default.createDirectory(atPath: inbox, withIntermediateDirectories: true)
        try writeMarker(transfer.id, recording: inbox + "/" + name)
        return (transfers, transfer, data, inbox)
    }

    @Test("A transfer claimed for a copy to another file system cannot be cancelled, and its receiver delivers it")
    func claimedTransferIsNotCancelled() async throws {
        try await offThePool {
            // What a receiver killed in the middle of its copy leaves: the marker, and the file claimed.
            let (transfers, transfer, data, inbox) = try interruptedDelivery(of: "report.bin", size: 200_000)
            try FileManager.default.moveItem(
                atPath: staging + "/\(transfer.id).file",
                toPath: staging + "/\(transfer.id).claimed"
            )
            try Data("half a copy".utf8).write(to: URL(fileURLWithPath: inbox + "/.\(transfer.id).part"))
            #expect(try !transfers.cancel(transfer.id), "taken already")
            #expect(try transfers.pendingTransferIDs().isEmpty)
            let (paths, errors) = try receive(transfers, into: inbox, count: 1)
            #expect(errors.isEmpty)
            #expect(paths == [inbox + "/report.bin"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: inbox + "/report.bin")) == data)
            #expect(try FileManager.default.contentsOfDirectory(atPath: inbox) == ["report.bin"])
            #expect(!FileManager.default.fileExists(atPath: staging + "/\(transfer.id).claimed"))
        }
    }

    @Test(
        "A copy to another file system that a cancellation raced is either delivered whole or not at all",
        .enabled(if: FileManager.default.fileExists(atPath: "/dev/shm"), "needs /dev/shm, another file system")
    )
    func cancellationAgainstCopy() async throws {
        try await offThePool {
            let inbox = "/dev/shm/wormhole-test-inbox-\(UUID().uuidString)"
            defer { try? FileManager.default.removeItem(atPath: inbox) }
            let transfers = try makeTransfers()
            let (path, data) = try makeFile("big.bin", size: 8_000_000)
            var outcomes: [Bool] = []
            for round in 0..<6 {
                let transfer = try transfers.send(file: path, name: "big-\(round).bin")
                let received = Collector<String>()
                let errors = Collector<String>()
                let receiver = try transfers.receive(
                    consumer: "viewer",
                    into: inbox,
                    on: .notifierThread,
                    errorHandler: { errors.append($0.message) }
                ) { received.append($0.path) }
                // Cancel at a different moment each round: before, during or after the copy.
                usleep(useconds_t(round * 3_000))
                let cancelled = try transfers.cancel(transfer.id)
                #expect(eventually { received.count + errors.count == 1 })
                receiver.cancel()
                outcomes.append(cancelled)
                let delivered = inbox + "/big-\(round).bin"
                if cancelled {
                    #expect(received.values.isEmpty, "round \(round): cancelled, yet delivered")
                    #expect(!FileManager.default.fileExists(atPath: delivered))
                } else {
                    #expect(received.values == [delivered])
                    #expect(try Data(contentsOf: URL(fileURLWithPath: delivered)) == data)
                }
            }
            let names = try FileManager.default.contentsOfDirectory(atPath: inbox)
            #expect(!names.contains { $0.hasSuffix(".part") }, "no partial copy is left: \(names)")
            #expect(outcomes.count == 6)
        }
    }

    @Test("A marker whose move never happened, the transfer then cancelled, reports a cancellation, not a path")
    func markerOfCancelledTransfer() async throws {
        try await offThePool {
            let transfers = try makeTransfers()
            let transfer = try transfers.send(file: try makeFile("a.txt", size: 10).path)
            try transfers.send(file: try makeFile("b.txt", size: 20).path)
            let inbox = directory("inbox")
            try writeMarker(transfer.id, recording: inbox + "/a.txt")
            #expect(try transfers.cancel(transfer.id))
            let (paths, errors) = try receive(transfers, into: inbox, count: 2)
            #expect(paths == [inbox + "/b.txt"])
            #expect(errors.count == 1 && errors[0].contains("cancelled"), "\(errors)")
            #expect(!FileManager.default.fileExists(atPath: staging + "/\(transfer.id).delivered"))
        }
    }

    @Test("A file that took the recorded name meanwhile is never replaced: the delivery takes another name")
    func deliveryNeverReplacesAFile() async throws {
        try await offThePool {
            // The receiver recorded the name, then was killed; the user saved a file of the same name since.
            let (transfers, _, data, inbox) = try interruptedDelivery(of: "notes.txt", size: 300)
            try Data("the user's own".utf8).write(to: URL(fileURLWithPath: inbox + "/notes.txt"))
            let (paths, errors) = try receive(transfers, into: inbox, count: 1)
            #expect(errors.isEmpty)
            #expect(paths == [inbox + "/notes (2).txt"])
            #expect(try String(contentsOfFile: inbox + "/notes.txt", encoding: .utf8) == "the user's own")
            #expect(try Data(contentsOf: URL(fileURLWithPath: inbox + "/notes (2).txt")) == data)
        }
    }

    @Test("A move never replaces an entry of the target directory, in it or in another")
    func moveWithoutReplacing() throws {
        let from = try DirectoryHandle.open(path: directory("from"), create: true)
        let into = try DirectoryHandle.open(path: directory("into"), create: true)
        try Data("new".utf8).write(to: URL(fileURLWithPath: directory("from/a")))
        try Data("kept".utf8).write(to: URL(fileURLWithPath: directory("into/a")))
        guard case .failure(let errno) = from.moveEntryWithoutReplacing("a", to: into, as: "a") else {
            Issue.record("a file was replaced")
            return
        }
        #expect(errno == .fileExists)
        #expect(try String(contentsOfFile: directory("into/a"), encoding: .utf8) == "kept")
        #expect(throws: Never.self) { try from.moveEntryWithoutReplacing("a", to: into, as: "b").get() }
        #expect(try String(contentsOfFile: directory("into/b"), encoding: .utf8) == "new")
        #expect(!FileManager.default.fileExists(atPath: directory("from/a")))
    }

    @Test("A marker that names a file outside the destination is refused and passed over; nothing is handed over")
    func markerOutsideTheDestination() async throws {
        try await offThePool {
            let transfers = try makeTransfers()
            let secret = try makeFile("secret.key", size: 64)
            let first = try transfers.send(file: try makeFile("a.txt", size: 10).path)
            try transfers.send(file: try makeFile("b.txt", size: 20).path)
            // Planted: no staged file any more, and a marker that points at another file of the user's.
            try FileManager.default.removeItem(atPath: staging + "/\(first.id).file")
            try writeMarker(first.id, recording: secret.path)
            let inbox = directory("inbox")
            let (paths, errors) = try receive(transfers, into: inbox, count: 2)
            #expect(paths == [inbox + "/b.txt"])
            #expect(errors.count == 1 && errors[0].contains("not a file of the destination"), "\(errors)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: secret.path)) == secret.data)
        }
    }

    @Test("A symbolic link planted as a staged file is refused and passed over; what it points at stays")
    func plantedStagedLink() async throws {
        try await offThePool {
            let transfers = try makeTransfers()
            let secret = try makeFile("secret.key", size: 64)
            let first = try transfers.send(file: try makeFile("a.txt", size: 10).path)
            try transfers.send(file: try makeFile("b.txt", size: 20).path)
            let staged = staging + "/\(first.id).file"
            try FileManager.default.removeItem(atPath: staged)
            try FileManager.default.createSymbolicLink(atPath: staged, withDestinationPath: secret.path)
            let inbox = directory("inbox")
            let (paths, errors) = try receive(transfers, into: inbox, count: 2)
            #expect(paths == [inbox + "/b.txt"])
            #expect(errors.count == 1 && errors[0].contains("passed over"), "\(errors)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: inbox) == ["b.txt"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: secret.path)) == secret.data)
        }
    }

    @Test("Removing abandoned copies keeps delivery markers, so a receiver back after a long stop gets its file")
    func abandonedCopiesKeepMarkers() async throws {
        try await offThePool {
            // A receiver that moved the file and was killed before handling it.
            let (transfers, transfer, data, inbox) = try interruptedDelivery(of: "photo.jpg", size: 1000)
            try FileManager.default.moveItem(atPath: staging + "/\(transfer.id).file", toPath: inbox + "/photo.jpg")
            try Data("partial".utf8).write(to: URL(fileURLWithPath: staging + "/abandoned.part"))
            try transfers.removeAbandonedCopies(olderThan: .zero)
            #expect(!FileManager.default.fileExists(atPath: staging + "/abandoned.part"))
            #expect(FileManager.default.fileExists(atPath: staging + "/\(transfer.id).delivered"))
            let (paths, errors) = try receive(transfers, into: inbox, count: 1)
            #expect(errors.isEmpty)
            #expect(paths == [inbox + "/photo.jpg"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: inbox + "/photo.jpg")) == data)
        }
    }

    @Test("A cancellation that cannot remove the staged file throws, rather than saying it was too late")
    func cancelThatFails() throws {
        let transfers = try makeTransfers()
        let transfer = try transfers.send(file: try makeFile("a.txt", size: 10).path)
        // Something that unlink cannot remove under that name: a directory.
        try FileManager.default.removeItem(atPath: staging + "/\(transfer.id).file")
        try FileManager.default.createDirectory(
            atPath: staging + "/\(transfer.id).file",
            withIntermediateDirectories: false
        )
        #expect(throws: WormholeError.self) { try transfers.cancel(transfer.id) }
    }

    @Test("Sending a FIFO fails at once with a typed error, instead of waiting for a writer")
    func sendingAFIFO() throws {
        let fifo = directory("pipe")
        #expect(mkfifo(fifo, 0o600) == 0)
        let transfers = try makeTransfers()
        let started = ContinuousClock.now
        #expect {
            try transfers.send(file: fifo)
        } throws: { error in
            (error as? WormholeError)?.message.contains("regular files") == true
        }
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(try transfers.pendingTransferIDs().isEmpty)
    }
}
