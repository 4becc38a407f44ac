import Foundation

/// Where a wormhole's live sockets live and how they are named, so that every process of the wormhole meets and
/// every address fits in a `sockaddr_un`.
///
/// On Linux a socket is addressed through `/proc/self/fd/N/NAME` (``UnixSocketAddress``), which fits however deep the
/// wormhole is: the sockets are in the wormhole's own `.live` directory, named as ``LiveSocketNaming/long`` says.
///
/// Darwin has neither `/proc` nor `bindat`, so an address is the socket's path, 103 bytes at most (`sun_path` is 104
/// with its NUL), and an iOS App Group container's path alone is 83 (`/private/var/mobile/Containers/Shared/AppGroup/`
/// and a UUID). There, names are short (``LiveSocketNaming/short(scope:)``, 20 bytes), paths are spelt short
/// (`/private/var/` as `/var/`, `/private/tmp/` as `/tmp/`: links every Apple system has), and the sockets go in the
/// first of these whose addresses fit:
/// 1. the wormhole's own `.live` (a directory of 75 bytes or less: an App Group container itself, a Mac's group
///    container, most paths a tool is given);
/// 2. the `.live` of the App Group container the wormhole is in (a directory `…/Containers/Shared/AppGroup/NAME` on
///    iOS, `…/Library/Group Containers/NAME` on a Mac: the one place every process of the group can reach, sandboxed
///    or not), the wormhole's path below it hashed into the names, so that the wormholes of one container do not meet;
/// 3. `/tmp/wormhole-live-HASH`, named by the hash of the wormhole's resolved path (a simulator's containers are far
///    too deep for any address; its processes are the Mac's). A sandbox that keeps `/tmp` from the app (a device's)
///    makes listening fail with an error that says to use a shorter directory.
///
/// Every process computes the same place from the wormhole's resolved path (`realpath`), as the Darwin notifier
/// names its notifications, so that `/tmp/x` and `/private/tmp/x`, or a group identifier and its container's path,
/// meet. Linux runs these rules too when `WORMHOLE_SOCKET_PATHS=1`, so that the tests try them here.
package struct LiveSocketPlacement: Equatable, Sendable {
    /// The directory of the sockets, as their addresses spell it.
    package var directory: String
    /// How the sockets are named there.
    package var naming: LiveSocketNaming
    /// Whether the directory is the wormhole's own `.live`.
    package var isWormholesOwn: Bool

    /// The longest path a socket's address may have: Darwin's `sun_path` of 104 bytes, less its NUL. (Linux's is
    /// 108; the rules keep to Darwin's, so that what the tests try here holds there.)
    package static let longestAddress = 103

    /// Whether sockets are addressed by their paths: on Darwin always, on Linux when the environment sets
    /// `WORMHOLE_SOCKET_PATHS=1` (every process of a wormhole must agree).
    package static let addressesArePaths: Bool = {
        #if canImport(Darwin)
        return true
        #else
        return ProcessInfo.processInfo.environment["WORMHOLE_SOCKET_PATHS"] == "1"
        #endif
    }()

    /// The place of the sockets of the wormhole at `path`.
    package static func forWormhole(at path: String) -> LiveSocketPlacement {
        guard addressesArePaths else {
            return LiveSocketPlacement(
                directory: path + "/" + LiveSocket.subdirectoryName,
                naming: .long,
                isWormholesOwn: true
            )
        }
        return forWormhole(resolvedPath: shortSpelling(resolvedPath(path)))
    }

    /// The rules above, for a resolved path spelt short.
    package static func forWormhole(resolvedPath path: String) -> LiveSocketPlacement {
        let room = longestAddress - LiveSocketNaming.longestShortEntry - 1  // the directory, then "/", then the entry
        let own = path + "/" + LiveSocket.subdirectoryName
        if own.utf8.count <= room {
            return LiveSocketPlacement(directory: own, naming: .short(scope: ""), isWormholesOwn: true)
        }
        if let container = appGroupContainer(of: path) {
            let shared = container + "/" + LiveSocket.subdirectoryName
            if shared.utf8.count <= room {
                let below = String(path.dropFirst(container.count + 1))
                return LiveSocketPlacement(directory: shared, naming: .short(scope: below), isWormholesOwn: false)
            }
        }
        let temporary = "/tmp/wormhole-live-" + LiveSocketNaming.base32(LiveSocketNaming.hash(path), digits: 12)
        return LiveSocketPlacement(directory: temporary, naming: .short(scope: ""), isWormholesOwn: false)
    }

    /// The App Group container that `path` is in, and not the container itself: the path up to a component that
    /// follows `Containers/Shared/AppGroup` (iOS, and its simulator) or `Library/Group Containers` (a Mac).
    package static func appGroupContainer(of path: String) -> String? {
        let components = path.split(separator: "/", omittingEmptySubsequences: false)
        guard components.count >= 4 else { return nil }
        for index in 2..<(components.count - 1) where !components[index].isEmpty {
            let iOS =
                index >= 3 && components[index - 3] == "Containers" && components[index - 2] == "Shared"
                && components[index - 1] == "AppGroup"
            let mac = components[index - 2] == "Library" && components[index - 1] == "Group Containers"
            if iOS || mac { return components[...index].joined(separator: "/") }
        }
        return nil
    }

    /// `/private/var/…` and `/private/tmp/…` as `/var/…` and `/tmp/…`, which Apple's systems link to them.
    package static func shortSpelling(_ path: String) -> String {
        for prefix in ["/private/var/", "/private/tmp/"] where path.hasPrefix(prefix) {
            return String(path.dropFirst("/private".count))
        }
        return path
    }

    /// The path with its links resolved; when it cannot be (it is not there yet), with `.`, `..` and extra slashes
    /// taken out, so that every spelling of one directory still gives one place.
    private static func resolvedPath(_ path: String) -> String {
        guard let resolved = realpath(path, nil) else { return URL(fileURLWithPath: path).standardizedFileURL.path }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}

/// How the sockets of a wormhole are named in the directory that holds them.
///
/// A socket's name starts with a prefix that the identifier (and the kind: listener of messages or responder to
/// requests) decides, so that a sender lists the directory and finds the sockets it wants by prefix, and a message
/// never reaches a responder, nor a request a listener; the rest of the name makes it unique.
package enum LiveSocketNaming: Equatable, Sendable {
    /// Linux's names: `HASH.m.PID.RANDOM` and `HASH.r.PID.RANDOM`, the identifier's 64-bit FNV-1a hash in
    /// hexadecimal, staged as `.b.NAME` until the socket listens.
    case long
    /// Path addresses' names, 20 bytes: 12 base-32 digits of the hash of the scope and the identifier, `m` or `r`,
    /// and 7 random digits; staged as `.NAME`. The scope is the wormhole's path below the directory's owner, or empty
    /// when the directory is the wormhole's own.
    case short(scope: String)

    /// The longest entry a short name makes in the directory: a name being staged.
    package static let longestShortEntry = 21

    /// The prefix of the sockets of `identifier`'s listeners of messages.
    package func listenerPrefix(for identifier: String) -> String {
        prefix(for: identifier, kind: "m")
    }

    /// The prefix of the sockets of `identifier`'s responders to requests.
    package func responderPrefix(for identifier: String) -> String {
        prefix(for: identifier, kind: "r")
    }

    private func prefix(for identifier: String, kind: String) -> String {
        switch self {
        case .long: return LiveSocket.prefix(for: identifier) + kind + "."
        case .short(let scope): return Self.base32(Self.hash(scope + "\u{0}" + identifier), digits: 12) + kind
        }
    }

    /// A new name for a socket under `prefix`.
    package func newName(prefix: String) -> String {
        switch self {
        case .long: return prefix + "\(ProcessFacts.processID).\(UInt32.random(in: 0...UInt32.max))"
        case .short: return prefix + Self.base32(UInt64.random(in: 0...UInt64.max), digits: 7)
        }
    }

    /// The hidden name a socket has until it listens.
    package func stagingName(for name: String) -> String {
        switch self {
        case .long: return ".b." + name
        case .short: return "." + name
        }
    }

    /// The 64-bit FNV-1a hash of the text's UTF-8 bytes.
    package static func hash(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return hash
    }

    /// The low `digits` base-32 digits of `value` (`a`–`z`, `2`–`7`: one case, for file systems that ignore it).
    package static func base32(_ value: UInt64, digits: Int) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567".utf8)
        var bytes = [UInt8](repeating: 0, count: digits)
        var rest = value
        for index in (0..<digits).reversed() {
            bytes[index] = alphabet[Int(rest & 31)]
            rest >>= 5
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
