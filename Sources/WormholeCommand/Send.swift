import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit

struct Send: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Pass a JSON message to a mailbox.",
        discussion: """
            The message is the JSON argument, or standard input when it is left out. Invalid JSON is refused \
            and nothing is written. Listeners of the identifier, in every process, are woken.
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The mailbox's identifier.")
    var identifier: String

    @Argument(help: "The message, as JSON (any JSON value). Read from standard input when left out.")
    var json: String?

    func run() throws {
        let trimmed = try validatedJSON(json, what: "message")
        let wormhole = try location.makeWormhole()
        try wormhole.passMessageData(trimmed, identifier: identifier)
    }
}

struct Read: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the message in a mailbox as one line of JSON.",
        discussion: "Exits with status 1, and says so on standard error, when the mailbox is empty."
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The mailbox's identifier.")
    var identifier: String

    @Flag(help: "Print the envelope (sequence, generation, sender, time and payload) instead of the payload alone.")
    var envelope = false

    func run() throws {
        let wormhole = try location.makeWormhole()
        guard let found = try wormhole.envelope(withIdentifier: identifier) else {
            throw Output.fail("the mailbox \"\(identifier)\" is empty")
        }
        Output.line(envelope ? Output.envelopeLine(found) : Output.jsonLine(found.payload))
    }
}

struct Clear: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Empty one mailbox, or all of them with --all.")

    @OptionGroup var location: LocationOptions

    @Argument(help: "The mailbox's identifier.")
    var identifier: String?

    @Flag(help: "Empty every mailbox of the wormhole.")
    var all = false

    func validate() throws {
        if all == (identifier != nil) { throw ValidationError("Give an identifier or --all.") }
    }

    func run() throws {
        let wormhole = try location.makeWormhole()
        if all {
            try wormhole.clearAllMessageContents()
        } else {
            try wormhole.clearMessageContents(forIdentifier: identifier!)
        }
    }
}

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the identifiers of the mailboxes that hold a message."
    )

    @OptionGroup var location: LocationOptions

    func run() throws {
        for identifier in try location.makeWormhole().identifiers() { Output.line(identifier) }
    }
}
