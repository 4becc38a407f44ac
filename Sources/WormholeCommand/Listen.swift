import ArgumentParser
import Foundation
import WormholeCLI
import Synchronization
import WormholeKit

struct Listen: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print each new message of a mailbox as one line of JSON, as it arrives.",
        discussion: """
            Each line is flushed at once. When the listener is ready, a line "listening to IDENTIFIER" goes to \
            standard error. A message that cannot be read (a damaged file) is reported on standard error and \
            listening goes on. With --count, exits after that many messages; with --timeout, exits with status 1 \
            if they have not all come by then (status 0 when no --count was given).
            """)

    @OptionGroup var location: LocationOptions

    @Argument(help: "The mailbox's identifier.")
    var identifier: String

    @Option(help: "Exit after this many messages.")
    var count: Int?

    @Option(help: "Exit after this many seconds.")
    var timeout: Double?

    @Flag(help: "Print the message already in the mailbox first, if there is one.")
    var includeCurrent = false

    @Flag(help: "Print envelopes (sequence, generation, sender, time, payload) instead of payloads.")
    var envelope = false

    func validate() throws {
        if let count, count < 1 { throw ValidationError("--count must be at least 1.") }
        if let timeout, timeout <= 0 { throw ValidationError("--timeout must be positive.") }
    }

    func run() throws {
        let wormhole = try location.makeWormhole()
        let received = Locked(0)
        let done = DispatchSemaphore(value: 0)
        let limit = count
        let printsEnvelopes = envelope
        let listener = try wormhole.listenForEnvelopes(
            withIdentifier: identifier, deliveringCurrentMessage: includeCurrent,
            errorHandler: { error in Output.error("\(error)") }
        ) { envelope in
            Output.line(printsEnvelopes ? Output.envelopeLine(envelope) : Output.jsonLine(envelope.payload))
            let total = received.withLock { count in
                count += 1
                return count
            }
            if total == limit { done.signal() }
        }
        FileHandle.standardError.write(Data("listening to \(identifier)\n".utf8))
        let finished = Output.wait(for: done, timeout: timeout)
        listener.cancel()
        if !finished, let limit {
            throw Output.fail("timed out after \(timeout!) s with \(received.withLock { $0 }) of \(limit) messages")
        }
    }
}
