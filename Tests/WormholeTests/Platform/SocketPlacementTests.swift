import Foundation
import Testing
import WormholeKit

/// Where live sockets go when their addresses are paths (Apple platforms: no `/proc`, no `bindat`, 104 bytes), by
/// the rules for the paths Apple's systems have, and across processes on Linux with `WORMHOLE_SOCKET_PATHS=1`.
@Suite("Live sockets addressed by their paths, as on Apple platforms", .limit(minutes: 2))
struct SocketPlacementTests {
    static let uuid = "0F4E3C2A-9B8D-4E6F-A1B2-C3D4E5F60718"
    static let container = "/var/mobile/Containers/Shared/AppGroup/" + uuid

    /// The longest entry a placement's naming makes, in its directory: what must fit in an address.
    static func longestAddress(_ placement: LiveSocketPlacement) -> Int {
        let name = placement.naming.newName(prefix: placement.naming.responderPrefix(for: "any identifier at all"))
        return (placement.directory + "/" + placement.naming.stagingName(for: name)).utf8.count
    }

    @Test("An App Group container's own wormhole keeps its .live; a subdirectory's sockets go in the container's")
    func iOSContainer() {
        #expect(LiveSocketPlacement.shortSpelling("/private" + Self.container) == Self.container)
        #expect(LiveSocketPlacement.shortSpelling("/private/tmp/x") == "/tmp/x")
        #expect(LiveSocketPlacement.shortSpelling("/privately/var/x") == "/privately/var/x")

        let own = LiveSocketPlacement.forWormhole(resolvedPath: Self.container)
        #expect(own.directory == Self.container + "/.live")
        #expect(own.naming == .short(scope: ""))
        #expect(Self.longestAddress(own) <= LiveSocketPlacement.longestAddress)

        // MMWormhole's usual optionalDirectory: the wormhole's own .live would not fit.
        let sub = LiveSocketPlacement.forWormhole(resolvedPath: Self.container + "/wormhole")
        #expect(sub.directory == Self.container + "/.live")
        #expect(sub.naming == .short(scope: "wormhole"))
        #expect(Self.longestAddress(sub) <= LiveSocketPlacement.longestAddress)
        // The two wormholes of one container share the directory but never each other's sockets.
        #expect(own.naming.listenerPrefix(for: "ping") != sub.naming.listenerPrefix(for: "ping"))
        #expect(own.naming.listenerPrefix(for: "ping") != own.naming.responderPrefix(for: "ping"))
        let deeper = LiveSocketPlacement.forWormhole(resolvedPath: Self.container + "/a/b")
        #expect(deeper.naming == .short(scope: "a/b"))

        #expect(LiveSocketPlacement.appGroupContainer(of: Self.container + "/wormhole") == Self.container)
        #expect(LiveSocketPlacement.appGroupContainer(of: Self.container) == nil)
        let macGroup = "/Users/a/Library/Group Containers/g"
        #expect(LiveSocketPlacement.appGroupContainer(of: macGroup + "/x") == macGroup)
        #expect(LiveSocketPlacement.appGroupContainer(of: macGroup) == nil)
    }

    @Test("A Mac's group container is like an iOS one; a simulator's, far too deep, uses /tmp by its path's hash")
    func otherPlaces() {
        let group = "/Users/alice/Library/Group Containers/group.com.ex.app"
        let mac = LiveSocketPlacement.forWormhole(resolvedPath: group)
        #expect(mac.directory == group + "/.live")
        #expect(Self.longestAddress(mac) <= LiveSocketPlacement.longestAddress)
        // A sandboxed Mac app reaches its group container, not /tmp: a deep wormhole in it uses the container's.
        let below = String(repeating: "x", count: 40)
        let deep = LiveSocketPlacement.forWormhole(resolvedPath: group + "/" + below)
        #expect(deep.directory == group + "/.live")
        #expect(deep.naming == .short(scope: below))

        let simulator =
            "/Users/alice/Library/Developer/CoreSimulator/Devices/\(Self.uuid)/data/Containers/Shared/AppGroup/"
            + Self.uuid
        let placed = LiveSocketPlacement.forWormhole(resolvedPath: simulator + "/wormhole")
        #expect(placed.directory.hasPrefix("/tmp/wormhole-live-"))
        #expect(placed.naming == .short(scope: ""))
        #expect(Self.longestAddress(placed) <= LiveSocketPlacement.longestAddress)
        // Each wormhole a directory of its own there.
        #expect(LiveSocketPlacement.forWormhole(resolvedPath: simulator + "/other").directory != placed.directory)
        #expect(LiveSocketPlacement.forWormhole(resolvedPath: simulator + "/wormhole") == placed)
    }

    @Test("Short names: 20 bytes of one case, prefixed by the identifier and the kind, each new one different")
    func shortNames() {
        let naming = LiveSocketNaming.short(scope: "")
        let prefix = naming.listenerPrefix(for: "ping")
        let names = (0..<100).map { _ in naming.newName(prefix: prefix) }
        #expect(Set(names).count == 100)
        for name in names {
            #expect(name.utf8.count == 20 && name.hasPrefix(prefix), "\(name)")
            #expect(name.allSatisfy { "abcdefghijklmnopqrstuvwxyz234567".contains($0) }, "\(name)")
        }
        #expect(naming.stagingName(for: names[0]).utf8.count == LiveSocketNaming.longestShortEntry)
        #expect(LiveSocketNaming.long.listenerPrefix(for: "ping").hasSuffix(".m."))
    }

    @Test(
        "Across processes with path addresses: a wormhole too deep for its own .live meets in its container's",
        .linuxOnly("WORMHOLE_SOCKET_PATHS turns Linux's /proc addresses into paths; Darwin has nothing else")
    )
    func acrossProcessesInAContainer() async throws {
        let temporary = TemporaryDirectory()
        // A container short enough for its .live to fit, and a wormhole in it too deep for its own.
        let container = temporary("Containers/Shared/AppGroup/G")
        let wormhole = container + "/" + String(repeating: "w", count: max(1, 90 - container.utf8.count))
        try FileManager.default.createDirectory(atPath: wormhole, withIntermediateDirectories: true)
        let placement = Self.placementWithPaths(wormhole)
        #expect(placement.directory == container + "/.live", "\(placement)")
        try await Self.liveAndRequests(in: wormhole, socketsIn: placement.directory)
    }

    @Test(
        "Across processes with path addresses: a wormhole too deep for any .live meets in /tmp",
        .linuxOnly("WORMHOLE_SOCKET_PATHS turns Linux's /proc addresses into paths; Darwin has nothing else")
    )
    func acrossProcessesInTemporary() async throws {
        let temporary = TemporaryDirectory()
        let wormhole = temporary(String(repeating: "d", count: 100))
        try FileManager.default.createDirectory(atPath: wormhole, withIntermediateDirectories: true)
        let placement = Self.placementWithPaths(wormhole)
        #expect(placement.directory.hasPrefix("/tmp/wormhole-live-"), "\(placement)")
        defer { try? FileManager.default.removeItem(atPath: placement.directory) }
        try await Self.liveAndRequests(in: wormhole, socketsIn: placement.directory)
    }

    /// The placement a process with `WORMHOLE_SOCKET_PATHS=1` computes (this one addresses through `/proc`).
    static func placementWithPaths(_ wormhole: String) -> LiveSocketPlacement {
        let resolved = URL(fileURLWithPath: wormhole).resolvingSymlinksInPath().path
        return LiveSocketPlacement.forWormhole(resolvedPath: LiveSocketPlacement.shortSpelling(resolved))
    }

    /// A live message and a request between two processes that address sockets by path, on framed connections (as
    /// Apple platforms do), their sockets in `sockets`.
    static func liveAndRequests(in wormhole: String, socketsIn sockets: String) async throws {
        let environment = ["WORMHOLE_SOCKET_PATHS": "1", "WORMHOLE_FRAMED_CONNECTIONS": "1"]
        let location = ["--directory", wormhole]
        try await offThePool {
            let listener = try RunningTool(
                ["live-listen"] + location + ["news", "--count", "1", "--timeout", "30"],
                environment: environment
            )
            defer { listener.kill() }
            #expect(listener.waitUntilListening(), "\(listener.errorSoFar)")
            let responder = try RunningTool(
                ["respond"] + location + ["lookup", "--exec", #"sed 's/"term"/"result"/'"#, "--count", "1"],
                environment: environment
            )
            defer { responder.kill() }
            #expect(responder.waitForError(containing: "responding to"), "\(responder.errorSoFar)")
            // Both sockets where the rules put them, with short names.
            let names = try FileManager.default.contentsOfDirectory(atPath: sockets).filter { !$0.hasPrefix(".") }
            #expect(names.count == 2 && names.allSatisfy { $0.utf8.count == 20 }, "\(names)")

            let sent = try WormholeTool.run(["live-send"] + location + ["news", "\"hello\""], environment: environment)
            #expect(sent.status == 0, "\(sent.error)")
            let heard = listener.finish(timeout: 20)
            #expect(heard.output.contains("hello"), "\(heard.output) \(heard.error)")

            let asked = try WormholeTool.run(
                ["request"] + location + ["lookup", #"{"term":"a"}"#, "--timeout", "10"],
                environment: environment
            )
            #expect(asked.status == 0, "\(asked.error)")
            #expect(asked.output.contains(#""result":"a""#), "\(asked.output)")
        }
    }
}
