import ArgumentParser
import Foundation
import WormholeKit

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

    /// The arguments that name the same wormhole in a child process.
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
