import Foundation

/// Finds the directory of an application group: the shared container that every process of the group can reach.
///
/// On Linux, a group is a directory named by its identifier under a root: `$WORMHOLE_APP_GROUPS` when set,
/// otherwise `$XDG_DATA_HOME/app-groups`, otherwise `~/.local/share/app-groups`. On Apple platforms it is the
/// App Group container that the system gives the app (`containerURL(forSecurityApplicationGroupIdentifier:)`).
public enum GroupContainer: Sendable {
    /// The environment variable that overrides the root of group containers on Linux.
    public static let rootEnvironmentVariable = "WORMHOLE_APP_GROUPS"

    /// The directory under which Linux group containers live, as the environment says.
    public static func rootDirectory(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let root = environment[rootEnvironmentVariable], !root.isEmpty { return root }
        if let data = environment["XDG_DATA_HOME"], data.hasPrefix("/") { return data + "/app-groups" }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return home + "/.local/share/app-groups"
    }

    /// The wormhole directory for a group and an optional subdirectory, without creating it.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` when the group identifier or the subdirectory name
    ///   breaks the rules of ``MessageIdentifier``; ``WormholeError/Code/directoryUnavailable`` when, on Apple
    ///   platforms, the system has no container for the group (the App Groups entitlement is missing).
    public static func directory(
        forApplicationGroupIdentifier group: String,
        optionalDirectory: String?,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(WormholeError) -> String {
        try MessageIdentifier.validate(group)
        if let optionalDirectory { try MessageIdentifier.validate(optionalDirectory) }
        #if canImport(Darwin)
        guard let container = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: group) else {
            throw WormholeError(
                .directoryUnavailable,
                "The system has no container for the App Group \"\(group)\". Add it to the App Groups "
                    + "capability of every target that uses it."
            )
        }
        let base = container.path
        #else
        let base = rootDirectory(environment: environment) + "/" + group
        #endif
        return optionalDirectory.map { base + "/" + $0 } ?? base
    }
}
