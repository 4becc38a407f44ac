import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

/// `wormhole defaults …`: a shared key-value suite from the shell.
struct Defaults: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Read, change and watch a shared key-value suite (values are JSON).",
        subcommands: [DefaultsGet.self, DefaultsSet.self, DefaultsDelete.self, DefaultsList.self, DefaultsWatch.self]
    )
}

struct DefaultsGet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get",
        abstract: "Print a key's value as JSON; exit status 1 when the key is not set."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The suite.") var suite: String
    @Argument(help: "The key.") var key: String

    func run() throws {
        guard let value = try location.makeWormhole().suite(suite).snapshot().json(forKey: key) else {
            throw Output.fail("\"\(key)\" is not set in the suite \"\(suite)\"")
        }
        Output.line(String(decoding: value, as: UTF8.self))
    }
}

struct DefaultsSet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Set a key to a JSON value; invalid JSON is refused and nothing changed."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The suite.") var suite: String
    @Argument(help: "The key.") var key: String
    @Argument(help: "The value, as JSON. Read from standard input when left out.") var json: String?
    @Option(help: "A direction to record with the change, such as app→widget.") var direction: String?

    func run() throws {
        let data = try validatedJSON(json, what: "value")
        try location.makeWormhole().suite(suite).setJSON(data, forKey: key, direction: direction)
    }
}

struct DefaultsDelete: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "delete", abstract: "Remove a key.")
    @OptionGroup var location: LocationOptions
    @Argument(help: "The suite.") var suite: String
    @Argument(help: "The key.") var key: String
    @Option(help: "A direction to record with the change.") var direction: String?

    func run() throws {
        try location.makeWormhole().suite(suite).removeValue(forKey: key, direction: direction)
    }
}

struct DefaultsList: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Print every key and value, as one JSON object."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The suite.") var suite: String

    func run() throws {
        let values = try location.makeWormhole().suite(suite).snapshot()
        let body = values.keys.map { key in
            let name = String(decoding: try! JSONEncoder().encode(key), as: UTF8.self)
            return name + ":" + String(decoding: values.json(forKey: key)!, as: UTF8.self)
        }
        Output.line("{" + body.joined(separator: ",") + "}")
    }
}

struct DefaultsWatch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print each change other processes make, one JSON line each: keys, sender, direction, new values.",
        discussion: "\"watching SUITE\" goes to standard error when ready."
    )
    @OptionGroup var location: LocationOptions
    @Argument(help: "The suite.") var suite: String
    @Option(name: .customLong("key"), help: "A key to watch (repeat for several); all keys by default.") var keys:
        [String] = []
    @Option(help: "Only changes made with this direction.") var direction: String?
    @OptionGroup var limits: ListeningLimits

    func run() throws {
        let suite = try location.makeWormhole().suite(suite)
        try limits.listen(ready: "watching \(suite.name)") { tally in
            try suite.observe(
                keys: keys.isEmpty ? nil : Set(keys),
                direction: direction,
                errorHandler: { Output.error("\($0)") }
            ) { change in
                Output.line(Self.line(change))
                tally.add()
            }
        }
    }

    /// A change as one line of JSON: direction, keys, sender, values, version.
    static func line(_ change: SuiteChange) -> String {
        let values = change.keys.sorted().map { key in
            let name = String(decoding: try! JSONEncoder().encode(key), as: UTF8.self)
            return name + ":" + (change.values.json(forKey: key).map { String(decoding: $0, as: UTF8.self) } ?? "null")
        }
        let keys = String(decoding: try! JSONEncoder().encode(change.keys.sorted()), as: UTF8.self)
        let sender = String(decoding: try! JSONEncoder().encode(change.sender), as: UTF8.self)
        let direction =
            change.direction.map { String(decoding: try! JSONEncoder().encode($0), as: UTF8.self) } ?? "null"
        return "{\"direction\":\(direction),\"keys\":\(keys),\"sender\":\(sender),"
            + "\"values\":{\(values.joined(separator: ","))},\"version\":\(change.version)}"
    }
}
