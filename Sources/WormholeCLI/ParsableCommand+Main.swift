import ArgumentParser
import Foundation

extension ParsableCommand {
    /// Runs the command line. A write to a pipe or socket whose reader is gone (a command that does not read its
    /// input, a closed `| head`) must fail that write, not kill the process: SIGPIPE is ignored.
    package static func mainIgnoringBrokenPipes() {
        signal(SIGPIPE, SIG_IGN)
        do {
            var command = try parseAsRoot()
            try command.run()
        } catch {
            exit(withError: error)
        }
    }
}
