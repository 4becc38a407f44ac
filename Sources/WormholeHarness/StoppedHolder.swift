import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `stopped-holder`: a writer stopped while it holds a lock, for the tests of bounded lock waits.
///
/// It writes once through the library (so that the file exists, as a real writer's would), then takes the lock of
/// that file as a writer of the package does (`flock`, exclusive, on its own open file), prints "locked" and stops
/// itself with SIGSTOP, as a debugger or a frozen cgroup would stop it there. Sent SIGCONT, it lets the lock go,
/// writes once more through the library, prints "done" and exits 0.
struct StoppedHolder: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stopped-holder",
        abstract: "Hold a mailbox's, a suite's or the coordination lock, stopped, until SIGCONT.",
        shouldDisplay: false
    )

    enum Kind: String, ExpressibleByArgument {
        case mailbox, suite, coordination
    }

    @Argument var kind: Kind
    @Option var directory: String
    @Option var name = "box"

    func run() throws {
        let wormhole: Wormhole
        let file: String
        switch kind {
        case .mailbox, .coordination:
            var configuration = Wormhole.Configuration()
            if kind == .coordination { configuration.coordination = .coordinated }
            wormhole = try Wormhole(directory: directory, configuration: configuration)
            try wormhole.passMessageObject("holder before", identifier: name)
            file = directory + "/" + (kind == .mailbox ? name + MailboxFormat.fileSuffix : ".coordination.lock")
        case .suite:
            wormhole = try Wormhole(directory: directory)
            try wormhole.suite(name).set("holder before", forKey: "written")
            file = directory + "/" + name + ".suite"
        }
        let descriptor = open(file, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0, flock(descriptor, LOCK_EX) == 0 else {
            throw ValidationError("could not lock \(file): errno \(errno)")
        }
        Output.line("locked")
        raise(SIGSTOP)
        // Continued: the lock goes with the file's close, then one more write shows the holder works on.
        close(descriptor)
        switch kind {
        case .mailbox, .coordination: try wormhole.passMessageObject("holder after", identifier: name)
        case .suite: try wormhole.suite(name).set("holder after", forKey: "written")
        }
        Output.line("done")
    }
}
