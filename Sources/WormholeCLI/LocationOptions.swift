import ArgumentParser
import Foundation
import WormholeKit
import WormholePostgres

/// Where a command's wormhole lives.
package struct LocationOptions: ParsableArguments {
    package init() {}

    @Option(
        name: .long,
        help: ArgumentHelp("The application group identifier, such as group.com.example.app.", valueName: "id")
    )
    package var group: String?

    @Option(
        name: .long,
        help: ArgumentHelp("A subdirectory of the group's container for the wormhole.", valueName: "name")
    )
    package var optionalDirectory: String?

    @Option(name: .long, help: ArgumentHelp("An explicit wormhole directory, instead of a group.", valueName: "path"))
    package var directory: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "A PostgreSQL server to share the wormhole across hosts, instead of a directory: "
                + "postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=MODE. The group is --group. "
                + "Defaults to $WORMHOLE_POSTGRES_URL.",
            valueName: "url"
        )
    )
    package var postgres: String?

    /// The server's URL: `--postgres`, else `WORMHOLE_POSTGRES_URL` when set.
    package var postgresURL: String? {
        postgres ?? ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
    }

    @Flag(name: .long, help: "Coordinate with a directory-wide lock (CoordinatedFileTransiting).")
    package var coordinated = false

    @Option(
        name: .long,
        help: ArgumentHelp("Poll for changes every N milliseconds instead of using inotify.", valueName: "ms")
    )
    package var pollInterval: Int?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Share the wormhole with the users of a Unix group (a name or a number): directories 2770 and files "
                + "0660 of that group. Every process sharing it must pass the same group.",
            valueName: "group"
        )
    )
    package var sharedGroup: String?

    package func validate() throws {
        if let postgresURL {
            guard group != nil else {
                throw ValidationError("A wormhole on PostgreSQL is named by --group ID (its group of processes).")
            }
            guard directory == nil, optionalDirectory == nil, !coordinated, pollInterval == nil, sharedGroup == nil
            else {
                throw ValidationError(
                    "--directory, --optional-directory, --coordinated, --poll-interval and --shared-group are for a "
                        + "wormhole in a directory, not with --postgres."
                )
            }
            // Child processes (the demo's) find the URL in their environment: never on a command line, where `ps`
            // would show its password.
            setenv("WORMHOLE_POSTGRES_URL", postgresURL, 1)
            return
        }
        switch (group, directory) {
        case (nil, nil): throw ValidationError("Name a wormhole with --group ID or --directory PATH.")
        case (_?, _?): throw ValidationError("Give --group or --directory, not both.")
        default: break
        }
        if optionalDirectory != nil && group == nil {
            throw ValidationError("--optional-directory goes with --group.")
        }
    }

    /// Opens the wormhole; `sender` names this process in the messages it passes (by default `wormhole[pid]`).
    package func makeWormhole(sender: String? = nil) throws -> Wormhole {
        var configuration = Wormhole.Configuration()
        if let sender { configuration.sender = "\(sender)[\(ProcessInfo.processInfo.processIdentifier)]" }
        if let postgresURL, let group {
            return Wormhole(engine: try PostgresEngine(url: postgresURL, group: group), sender: configuration.sender)
        }
        configuration.coordination = coordinated ? .coordinated : .none
        if let pollInterval { configuration.notification = .polling(interval: .milliseconds(pollInterval)) }
        if let sharedGroup { configuration.fileOptions = .shared(withGroup: try Self.groupID(sharedGroup)) }
        if let group {
            return try Wormhole(
                applicationGroupIdentifier: group,
                optionalDirectory: optionalDirectory,
                configuration: configuration
            )
        }
        return try Wormhole(directory: directory!, configuration: configuration)
    }

    /// The id of a Unix group given by name or number.
    package static func groupID(_ group: String) throws -> UInt32 {
        if let number = UInt32(group) { return number }
        guard let entry = getgrnam(group) else {
            throw ValidationError(
                "There is no Unix group named \(group); give a group name or number to --shared-group."
            )
        }
        return UInt32(entry.pointee.gr_gid)
    }

    /// The arguments that name the same wormhole in a child process; a `--postgres` URL travels in the environment
    /// (`WORMHOLE_POSTGRES_URL`) instead.
    package var arguments: [String] {
        var result: [String] = []
        if let group { result += ["--group", group] }
        if let optionalDirectory { result += ["--optional-directory", optionalDirectory] }
        if let directory { result += ["--directory", directory] }
        if coordinated { result.append("--coordinated") }
        if let pollInterval { result += ["--poll-interval", String(pollInterval)] }
        if let sharedGroup { result += ["--shared-group", sharedGroup] }
        return result
    }
}
