import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

/// `wormhole transfer …`: hand files to another process of the group.
struct TransferCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transfer",
        abstract: "Send files to another process of the group, and receive them.",
        subcommands: [TransferSend.self, TransferReceive.self, TransferCancel.self, TransferList.self]
    )
}

struct TransferSend: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Copy a file into the wormhole and queue it for the receivers; prints the transfer id.",
        discussion: "A progress bar goes to standard error while the file is copied."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The transfer channel.") var channel: String
    @Argument(help: "The file to send.") var file: String
    @Option(help: "The name the receiver gets it under.") var name: String?
    @Option(name: .customLong("meta"), help: "Metadata as KEY=VALUE (repeat for several).") var metadata: [String] = []

    func run() throws {
        var pairs: [String: String] = [:]
        for pair in metadata {
            guard let equals = pair.firstIndex(of: "=") else {
                throw ValidationError("--meta takes KEY=VALUE, not \(pair).")
            }
            pairs[String(pair[..<equals])] = String(pair[pair.index(after: equals)...])
        }
        let bar = ProgressBar()
        let transfer = try location.makeWormhole().transfers(channel).send(file: file, name: name, metadata: pairs) {
            bar.show($0)
        }
        FileHandle.standardError.write(Data("\n".utf8))
        Output.line(transfer.id)
    }
}

struct TransferReceive: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "receive",
        abstract: "Move each file sent on a channel into a directory; print one JSON line per file.",
        discussion: "\"receiving CHANNEL\" goes to standard error when ready."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The transfer channel.") var channel: String
    @Option(help: "The receiver's durable name.") var consumer: String
    @Option(help: "The directory to put the files in.") var into: String
    @OptionGroup var limits: ListeningLimits

    func run() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let transfers = try location.makeWormhole().transfers(channel)
        try limits.listen(ready: "receiving \(channel)") { tally in
            try transfers.receive(consumer: consumer, into: into, errorHandler: { Output.error("\($0)") }) { file in
                // Past the limit, refuse: those files stay for the next receive.
                guard !tally.isReached else { throw CancellationError() }
                let line: [String: String] = [
                    "id": file.transfer.id, "name": file.transfer.name, "path": file.path,
                    "sender": file.transfer.sender, "size": String(file.transfer.size),
                ].merging(file.transfer.metadata.mapKeys { "meta." + $0 }) { first, _ in first }
                Output.line(String(decoding: try encoder.encode(line), as: UTF8.self))
                tally.add()
            }
        }
    }
}

struct TransferCancel: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cancel",
        abstract: "Cancel a transfer no receiver has taken yet; exit status 1 if it was taken."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The transfer channel.") var channel: String
    @Argument(help: "The transfer id that send printed.") var id: String

    func run() throws {
        guard try location.makeWormhole().transfers(channel).cancel(id) else {
            throw Output.fail("transfer \(id) was already received, or is unknown")
        }
    }
}

struct TransferList: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Print the ids of the transfers sent and not yet received."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The transfer channel.") var channel: String

    func run() throws {
        for id in try location.makeWormhole().transfers(channel).pendingTransferIDs() { Output.line(id) }
    }
}

extension Dictionary {
    func mapKeys<T: Hashable>(_ transform: (Key) -> T) -> [T: Value] {
        [T: Value](uniqueKeysWithValues: map { (transform($0.key), $0.value) })
    }
}
