import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit
import WormholePostgres

/// `wormhole postgres`: set up and look at a database that wormholes share across hosts.
struct PostgresCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "postgres",
        abstract: "Set up a PostgreSQL database for wormholes across hosts, grant and revoke groups, show their state.",
        subcommands: [Setup.self, Grant.self, Revoke.self, Rotate.self, Status.self]
    )

    /// The server, from `--postgres` or `WORMHOLE_POSTGRES_URL`.
    struct Server: ParsableArguments {
        @Option(
            name: .long,
            help: ArgumentHelp(
                "postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=MODE; defaults to $WORMHOLE_POSTGRES_URL.",
                valueName: "url"
            )
        )
        var postgres: String?

        /// The server's URL: `--postgres`, else `WORMHOLE_POSTGRES_URL` when set.
        var postgresURL: String? {
            postgres ?? ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
        }

        func validate() throws {
            guard postgresURL != nil else {
                throw ValidationError("Name the server with --postgres URL or WORMHOLE_POSTGRES_URL.")
            }
        }

        func administration() throws -> PostgresAdministration { try PostgresAdministration(url: postgresURL!) }
    }

    struct Setup: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create or upgrade the wormhole schema (versioned migrations under a lock; safe to run again)."
        )

        @OptionGroup var server: Server

        func run() throws {
            let administration = try server.administration()
            defer { administration.close() }
            let (before, after) = try administration.setUp()
            Output.line(
                before == after
                    ? "The wormhole schema is at version \(after); nothing to do."
                    : "The wormhole schema went from version \(before) to \(after)."
            )
        }
    }

    struct Grant: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Let a role use a group, and only the groups granted to it (row-level security)."
        )

        @OptionGroup var server: Server

        @Option(name: .long, help: ArgumentHelp("The group, such as group.com.example.app.", valueName: "id"))
        var group: String

        @Option(name: .long, help: ArgumentHelp("The PostgreSQL role (it must exist).", valueName: "role"))
        var role: String

        func run() throws {
            let administration = try server.administration()
            defer { administration.close() }
            try administration.grant(group: group, to: role)
            Output.line("The role \(role) may use the group \(group).")
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Take a group from a role, and rotate the group's channel and key.",
            discussion: """
                The role's processes lose the group at once: their live endpoints go, and they cannot read the new \
                channel or key. The group's other processes move to the new channel by themselves and read again \
                what came meanwhile; a live message sent in the moment of the move may be lost.
                """
        )

        @OptionGroup var server: Server

        @Option(name: .long, help: ArgumentHelp("The group.", valueName: "id"))
        var group: String

        @Option(name: .long, help: ArgumentHelp("The role, or the name a dropped role had.", valueName: "role"))
        var role: String

        func run() throws {
            let administration = try server.administration()
            defer { administration.close() }
            let revoked = try administration.revoke(group: group, from: role)
            Output.line(
                revoked
                    ? "The role \(role) may no longer use the group \(group); its channel and key are new."
                    : "The role \(role) had no grant of the group \(group); its channel and key are new all the same."
            )
        }
    }

    struct Rotate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Give a group a new channel and key, as after a leak (its processes move by themselves)."
        )

        @OptionGroup var server: Server

        @Option(name: .long, help: ArgumentHelp("The group.", valueName: "id"))
        var group: String

        func run() throws {
            let administration = try server.administration()
            defer { administration.close() }
            try administration.rotate(group: group)
            Output.line("The group \(group) has a new channel and key.")
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the groups, their queues with each consumer's lag, and live endpoints, as JSON."
        )

        @OptionGroup var server: Server

        @Option(name: .long, help: ArgumentHelp("Only this group.", valueName: "id"))
        var group: String?

        func run() throws {
            let administration = try server.administration()
            defer { administration.close() }
            let status = try administration.status(group: group)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
            Output.line(String(decoding: try encoder.encode(status), as: UTF8.self))
        }
    }
}
