import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

struct Listen: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print each new message of a mailbox as one line of JSON, as it arrives.",
        discussion: """
            Each line is flushed at once. When the listener is ready, a line "listening to IDENTIFIER" goes to \
            standard error. A message that cannot be read (a damaged file) is reported on standard error and \
            listening goes on. With --count, exits after that many messages; with --timeout, exits with status 1 \
            if they have not all come by then (status 0 when no --count was given).
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The mailbox's identifier.")
    var identifier: String

    @OptionGroup var limits: ListeningLimits

    @Flag(help: "Print the message already in the mailbox first, if there is one.")
    var includeCurrent = false

    @Flag(help: "Print envelopes (sequence, generation, sender, time, payload) instead of payloads.")
    var envelope = false

    func run() throws {
        let wormhole = try location.makeWormhole()
        let printsEnvelopes = envelope
        try limits.listen(ready: "listening to \(identifier)") { tally in
            try wormhole.listenForEnvelopes(
                withIdentifier: identifier,
                deliveringCurrentMessage: includeCurrent,
                errorHandler: { error in Output.error("\(error)") }
            ) { envelope in
                Output.line(printsEnvelopes ? Output.envelopeLine(envelope) : Output.jsonLine(envelope.payload))
                tally.add()
            }
        }
    }
}
