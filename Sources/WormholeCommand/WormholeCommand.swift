import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit

/// The `wormhole` command-line tool.
@main
struct WormholeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wormhole",
        abstract: "Pass messages between processes through a shared directory, with live notifications.",
        discussion: """
            Each command works on a wormhole directory, named either by an application group and an optional \
            subdirectory (--group, --optional-directory), under $WORMHOLE_APP_GROUPS or \
            ~/.local/share/app-groups, or by a path (--directory), or on a PostgreSQL server shared across hosts \
            (--postgres URL with --group; see `wormhole postgres`). Messages are JSON, so what the tool sends a \
            Swift program reads, and the reverse.

            Start with `wormhole demo`.
            """,
        version: "0.1.0",
        subcommands: [
            Send.self, Read.self, Listen.self, Clear.self, List.self, Enqueue.self, Consume.self, DeadLetters.self,
            QueueStatusCommand.self, Request.self, Respond.self, LiveSend.self, LiveListen.self, Defaults.self,
            TransferCommand.self, SessionCommand.self,
            StoreCommand.self,
            PostgresCommand.self,
            Demo.self,
            // Hidden: the demo's own child processes.
            DemoRole.self, DemoRoleStore.self,
        ]
    )
}

extension WormholeCommand {
    /// Runs it; see ``ParsableCommand/mainIgnoringBrokenPipes()``.
    static func main() { mainIgnoringBrokenPipes() }
}
