import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit
import WormholePostgres

/// `wormhole demo session`: a phone and its watch, as WatchConnectivity has them, through a session.
struct DemoSession: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "session",
        abstract: "Show a phone and its watch talking through a session, as WatchConnectivity's WCSession.",
        discussion: """
            The phone updates its application context, queues user info and a file while the watch is away; the \
            watch activates and gets the newest context at once, then the rest; the phone sends a message and gets \
            the watch's reply; the watch goes away and the next message fails with "not reachable". Where this \
            machine allows it (root, `ip netns`, PostgreSQL installed), the phone and the watch are on two hosts \
            (network namespaces) with a PostgreSQL server of the demo's own; elsewhere, or with --one-host, they \
            are two processes of this host on a directory; with --postgres URL, two processes on that server.
            """
    )

    @Flag(help: "Run both processes on this host, on a directory, even where two hosts could be made.")
    var oneHost = false

    @Option(
        help: ArgumentHelp(
            "A PostgreSQL server to use instead of one of the demo's own: postgres://USER:PASSWORD@HOST/DATABASE.",
            valueName: "url"
        )
    )
    var postgres: String?

    func run() throws {
        let scratch = FileManager.default.temporaryDirectory
            .appendingPathComponent("wormhole-demo-session-\(getpid())").path
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let group = "group.com.example.wormhole-demo.session-\(UInt32.random(in: 0...UInt32.max))"
        let given =
            postgres ?? ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
        let unavailable = NetworkHosts.unavailableReason() ?? LocalPostgresServer.unavailableReason()

        if let given {
            Output.line("Wormhole session demo: a phone and its watch, two processes of this host, through PostgreSQL.")
            Output.line("Server: \(try PostgresLocation(url: given)), group \(group).")
            let place = Demo.Placement(environment: ["WORMHOLE_POSTGRES_URL": given])
            try Self.play(location: ["--group", group], phone: place, watch: place, scratch: scratch)
        } else if oneHost || unavailable != nil {
            if let unavailable, !oneHost { Output.line("No hosts of the demo's own here (\(unavailable)).") }
            // A directory of its own under the default group root, removed at the end: nothing left from a run before.
            let directory =
                try GroupContainer.directory(forApplicationGroupIdentifier: DemoDefaults.group, optionalDirectory: nil)
                + "/session-\(getpid())"
            defer { try? FileManager.default.removeItem(atPath: directory) }
            Output.line("Wormhole session demo: a phone and its watch, two processes of this host.")
            Output.line("Shared directory: \(directory)")
            try Self.play(location: ["--directory", directory], phone: .init(), watch: .init(), scratch: scratch)
        } else {
            Output.line("Wormhole session demo: a phone and its watch on two hosts, through PostgreSQL.")
            let hosts = try NetworkHosts(count: 2)
            defer { hosts.close() }
            let server = try LocalPostgresServer(listenAddresses: ["127.0.0.1"] + hosts.serverAddresses)
            defer { server.close() }
            Output.line(
                "Hosts: \"phone\" at \(hosts.hostAddress(0)) and \"watch\" at \(hosts.hostAddress(1)); PostgreSQL "
                    + "\(server.processIdentifier) reached by each through its own link."
            )
            try PostgresEngine(url: server.url, group: group).close()
            func placement(_ index: Int) -> Demo.Placement { Demo.Placement(host: index, of: hosts, server: server) }
            try Self.play(location: ["--group", group], phone: placement(0), watch: placement(1), scratch: scratch)
            Output.line("The hosts, their links and the server are removed now.")
        }
    }

    /// The demo's story, each step a `wormhole session` process placed as given.
    static func play(location: [String], phone: Demo.Placement, watch: Demo.Placement, scratch: String) throws {
        let phoneNames = ["--as", "phone", "--counterpart", "watch"] + location
        let watchNames = ["--as", "watch", "--counterpart", "phone", "--into", scratch + "/watch-inbox"] + location
        let phoneLabel = "  [phone\(phone.label)] "
        let watchLabel = "  [watch\(watch.label)] "

        /// Runs one phone command to its end; returns its status and the lines it printed.
        func phoneRuns(_ arguments: [String], echo: Bool = true) throws -> (Int32, [String]) {
            let lines = Collected()
            let process = try Demo.child(arguments + phoneNames, phone, onError: { lines.add("error: " + $0) }) {
                lines.add($0)
                if echo { Output.line(phoneLabel + $0) }
            }
            let status = process.wait(timeout: 60)
            for line in lines.values where line.hasPrefix("error: ") { Output.line(phoneLabel + line) }
            return (status, lines.values)
        }

        Output.line("")
        Output.line("The watch is away. The phone updates its application context three times:")
        for minute in [10, 11, 12] {
            let context = "{\"face\":\"modular\",\"nextEvent\":\"standup at 9:\(minute)\"}"
            Output.line(phoneLabel + "updateApplicationContext \(context)")
            guard try phoneRuns(["session", "context", context]).0 == 0 else {
                throw Output.fail("the phone could not update its context")
            }
        }
        Output.line("…and queues user info and a 4 MiB file for it:")
        Output.line(phoneLabel + "transferUserInfo {\"steps\":4200}")
        guard try phoneRuns(["session", "transfer-user-info", "{\"steps\":4200}"], echo: false).0 == 0 else {
            throw Output.fail("the phone could not queue user info")
        }
        let track = scratch + "/workout.gpx"
        try Data((0..<(4 << 20)).map { UInt8($0 % 251) }).write(to: URL(fileURLWithPath: track))
        Output.line(phoneLabel + "transferFile workout.gpx (metadata kind=workout)")
        guard
            try phoneRuns(["session", "transfer-file", track, "--meta", "kind=workout", "--progress-lines"]).0 == 0
        else { throw Output.fail("the phone could not queue the file") }

        Output.line("")
        Output.line("The watch activates: the newest context comes at once, then the user info and the file.")
        let events = Collected()
        let ready = DispatchSemaphore(value: 0)
        let watchProcess = try Demo.child(
            ["session", "watch", "--reply", "{\"pong\":\"from the watch\"}"] + watchNames,
            watch,
            onError: { line in
                if line.hasPrefix("watching ") { ready.signal() } else { Output.line(watchLabel + line) }
            }
        ) { line in
            events.add(line)
            Output.line(watchLabel + Self.describe(line))
        }
        defer { watchProcess.terminate() }
        guard ready.wait(timeout: .now() + 30) == .success else {
            throw Output.fail("the watch did not activate in 30 s")
        }
        let arrived = events.wait(timeout: 30) { lines in
            ["\"context\"", "\"userInfo\"", "\"file\""].allSatisfy { kind in lines.contains { $0.contains(kind) } }
        }
        guard arrived else { throw Output.fail("the watch did not get the context, user info and file in 30 s") }

        Output.line("")
        Output.line("The phone sends a message; the watch is reachable and replies:")
        Output.line(phoneLabel + "sendMessage {\"ping\":1}")
        let (sent, reply) = try phoneRuns(["session", "send", "{\"ping\":1}"], echo: false)
        guard sent == 0, let answer = reply.first else { throw Output.fail("the message got no reply: \(reply)") }
        Output.line(phoneLabel + "reply \(answer)")

        Output.line("")
        Output.line("The watch goes away (its process is killed); the next message fails at once:")
        watchProcess.kill()
        _ = watchProcess.wait(timeout: 10)
        Output.line(phoneLabel + "sendMessage {\"ping\":2}")
        let (failed, output) = try phoneRuns(["session", "send", "{\"ping\":2}"], echo: false)
        guard failed != 0, output.contains(where: { $0.contains("not reachable") }) else {
            throw Output.fail("the message to the absent watch did not fail with \"not reachable\": \(output)")
        }
        Output.line(phoneLabel + "→ not reachable, as it should: a context, user info or a file would wait for it.")
        Output.line("")
    }

    /// A `wormhole session watch` line, told in words.
    static func describe(_ line: String) -> String {
        guard let data = line.data(using: .utf8),
            let event = try? JSONDecoder().decode([String: JSONValue].self, from: data),
            let kind = event["event"]?.stringValue
        else { return line }
        switch kind {
        case "context":
            return "didReceiveApplicationContext \(event["context"]?.description ?? "") (changed: "
                + "\((event["changed"]?.arrayValue ?? []).compactMap(\.stringValue).joined(separator: ", ")))"
        case "userInfo": return "didReceiveUserInfo \(event["userInfo"]?.description ?? "")"
        case "file":
            return "didReceive file \(event["name"]?.stringValue ?? "") (\(event["size"]?.intValue ?? 0) bytes, "
                + "metadata \(event["metadata"]?.description ?? ""))"
        case "message": return "didReceiveMessage \(event["message"]?.description ?? ""); replying"
        case "reachable": return "the phone is \(event["reachable"]?.boolValue == true ? "" : "not ")reachable"
        default: return line
        }
    }
}

/// Lines collected from a child, with a wait for a condition on them.
private final class Collected: Sendable {
    private let lines = Locked<[String]>([])
    func add(_ line: String) { lines.withLock { $0.append(line) } }
    var values: [String] { lines.withLock { $0 } }

    func wait(timeout: Double, until condition: ([String]) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if condition(values) { return true }
            Thread.sleep(forTimeInterval: 0.02)
        }
        return condition(values)
    }
}
