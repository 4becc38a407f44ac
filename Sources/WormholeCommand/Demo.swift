import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

/// A tap on the app's button: the message the demo's app passes to its widget.
struct Tap: Codable, Sendable {
    var number: Int
    /// When the app passed it, in nanoseconds since 1970, to measure the one-way latency.
    var sentAt: Int64
}

/// The widget's answer to a tap.
struct WidgetReply: Codable, Sendable {
    var number: Int
    var text: String
}

enum DemoDefaults {
    static let group = "group.com.example.wormhole-demo"
    static let optionalDirectory = "wormhole"
}

func wallClockNanoseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1e9) }

struct Demo: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show an app and its widget extension talking through a wormhole, in three processes.",
        discussion: """
            Starts a "widget" process that listens for taps, then an "app" process that passes taps and waits for \
            the widget's replies, then a third process, started after both have exited, that reads what was \
            left in the mailbox. Runs on the default group root ($WORMHOLE_APP_GROUPS or \
            ~/.local/share/app-groups), in the group \(DemoDefaults.group). `wormhole demo store` shows a \
            shared SQLite store instead; `wormhole demo hosts` shows the app and the widget on two hosts, through \
            PostgreSQL; `wormhole demo session` a phone and its watch through a session, as WatchConnectivity's.
            """,
        subcommands: [DemoStore.self, DemoHosts.self, DemoSession.self]
    )

    @Option(help: "How many taps the app passes.")
    var taps = 5

    @Option(help: "The application group to use.")
    var group = DemoDefaults.group

    func validate() throws {
        if taps < 1 || taps > 10_000 { throw ValidationError("--taps must be between 1 and 10000.") }
    }

    func run() throws {
        let location = ["--group", group, "--optional-directory", DemoDefaults.optionalDirectory]
        let wormhole = try Wormhole(
            applicationGroupIdentifier: group,
            optionalDirectory: DemoDefaults.optionalDirectory
        )
        try wormhole.clearAllMessageContents()
        Output.line("Wormhole demo: an app and its widget extension, in separate processes.")
        Output.line("Shared directory: \(wormhole.directory ?? "?")")
        Output.line("")

        try Self.runProcesses(taps: taps, location: location)
    }

    /// Where a process of the demo runs: a launcher prefix (`ip netns exec HOST`) and variables of its own.
    struct Placement {
        var launcher: [String] = []
        var environment: [String: String] = [:]
        var label: String = ""

        init(launcher: [String] = [], environment: [String: String] = [:], label: String = "") {
            self.launcher = launcher
            self.environment = environment
            self.label = label
        }

        /// Inside host `index` of `hosts`, reaching `server` through that host's own link.
        init(host index: Int, of hosts: NetworkHosts, server: LocalPostgresServer) {
            self.init(
                launcher: ["/usr/sbin/ip", "netns", "exec", hosts.namespace(index)],
                environment: ["WORMHOLE_POSTGRES_URL": server.url(host: hosts.serverAddress(index))],
                label: "@" + hosts.hostAddress(index)
            )
        }
    }

    /// Starts this tool as a child process with `arguments`, placed as given (behind its launcher, with its
    /// variables).
    static func child(
        _ arguments: [String],
        _ placement: Placement,
        readyLine: String? = nil,
        onError: (@Sendable (String) -> Void)? = nil,
        onLine: @escaping @Sendable (String) -> Void
    ) throws -> ChildProcess {
        try ChildProcess(
            executable: placement.launcher.first ?? ChildProcess.executablePath,
            arguments: placement.launcher.isEmpty
                ? arguments : Array(placement.launcher.dropFirst()) + [ChildProcess.executablePath] + arguments,
            environment: placement.environment,
            readyLine: readyLine,
            onErrorLine: onError,
            onLine: onLine
        )
    }

    /// Runs the widget, then the app, then the late reader, each in its own process (placed as given), and prints
    /// what they say and the round trips measured.
    static func runProcesses(
        taps: Int,
        location: [String],
        widgetPlacement: Placement = Placement(),
        appPlacement: Placement = Placement(),
        readerPlacement: Placement = Placement()
    ) throws {
        let latencies = Locked<[Double]>([])
        let widgetLabel = "  [widget\(widgetPlacement.label)] "
        let widget = try child(
            ["demo-role", "widget", "--taps", String(taps)] + location,
            widgetPlacement,
            readyLine: "ready"
        ) { line in Output.line(widgetLabel + line) }
        guard widget.waitUntilReady(timeout: 20) else {
            widget.terminate()
            throw Output.fail("the widget process did not start listening within 20 s")
        }
        let appLabel = "  [app\(appPlacement.label)]    "
        let app = try child(["demo-role", "app", "--taps", String(taps)] + location, appPlacement) { line in
            if line.hasPrefix("latency ") {
                if let value = Double(line.dropFirst("latency ".count)) { latencies.withLock { $0.append(value) } }
            } else {
                Output.line(appLabel + line)
            }
        }
        let appStatus = app.wait(timeout: 60)
        let widgetStatus = widget.wait(timeout: 20)
        guard appStatus == 0, widgetStatus == 0 else {
            throw Output.fail("the app exited with \(appStatus) and the widget with \(widgetStatus)")
        }

        Output.line("")
        Output.line("Both have exited. A process started now finds what they left in the mailboxes:")
        let readerLabel = "  [reader\(readerPlacement.label)] "
        let reader = try child(["demo-role", "late-reader"] + location, readerPlacement) { line in
            Output.line(readerLabel + line)
        }
        guard reader.wait(timeout: 20) == 0 else { throw Output.fail("the late reader failed") }

        let measured = latencies.withLock { $0 }.sorted()
        if !measured.isEmpty {
            Output.line("")
            Output.line(
                String(
                    format: "Round trip app → widget → app: median %.0f µs, slowest %.0f µs over %d taps "
                        + "(one-way ≈ half). For careful figures run: swift run -c release WormholeHarness bench",
                    measured[measured.count / 2],
                    measured.last!,
                    measured.count
                )
            )
        }
    }
}

/// The demo's child processes; hidden from help.
struct DemoRole: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-role",
        abstract: "Run one process of the demo.",
        shouldDisplay: false
    )

    enum Role: String, ExpressibleByArgument {
        case app, widget
        case lateReader = "late-reader"
    }

    @Argument var role: Role
    @Option var taps = 5
    @OptionGroup var location: LocationOptions

    func run() throws {
        let wormhole = try location.makeWormhole(sender: role.rawValue)
        switch role {
        case .widget: try runWidget(wormhole)
        case .app: try runApp(wormhole)
        case .lateReader: try runLateReader(wormhole)
        }
    }

    private func runWidget(_ wormhole: Wormhole) throws {
        let finished = DispatchSemaphore(value: 0)
        let total = taps
        let listener = try wormhole.listenForMessage(
            withIdentifier: "button",
            as: Tap.self,
            errorHandler: { Output.line("could not read a tap: \($0)") }
        ) { tap in
            let oneWay = Double(wallClockNanoseconds() - tap.sentAt) / 1000
            Output.line(String(format: "tap %d arrived %.0f µs after it was passed; replying", tap.number, oneWay))
            do {
                try wormhole.passMessageObject(
                    WidgetReply(number: tap.number, text: "widget shows \(tap.number)"),
                    identifier: "widget-reply"
                )
            } catch {
                Output.line("could not reply: \(error)")
            }
            if tap.number == total { finished.signal() }
        }
        Output.line("listening for taps on \"button\"")
        Output.line("ready")
        if finished.wait(timeout: .now() + 30) == .timedOut { throw Output.fail("the widget saw no last tap in 30 s") }
        listener.cancel()
    }

    private func runApp(_ wormhole: Wormhole) throws {
        let replies = Locked<[Int: UInt64]>([:])
        let replied = DispatchSemaphore(value: 0)
        let listener = try wormhole.listenForMessage(withIdentifier: "widget-reply", as: WidgetReply.self) { reply in
            replies.withLock { $0[reply.number] = DispatchTime.now().uptimeNanoseconds }
            Output.line("the widget replied: \"\(reply.text)\"")
            replied.signal()
        }
        for number in 1...taps {
            let start = DispatchTime.now().uptimeNanoseconds
            Output.line("passing tap \(number)")
            try wormhole.passMessageObject(Tap(number: number, sentAt: wallClockNanoseconds()), identifier: "button")
            var answered: UInt64?
            while answered == nil {
                guard replied.wait(timeout: .now() + 5) == .success else {
                    throw Output.fail("no reply to tap \(number) within 5 s")
                }
                answered = replies.withLock { $0[number] }
            }
            Output.line("latency " + String(Double(answered! - start) / 1000))
            Thread.sleep(forTimeInterval: 0.2)
        }
        listener.cancel()
    }

    private func runLateReader(_ wormhole: Wormhole) throws {
        guard let tap = try wormhole.message(withIdentifier: "button", as: Tap.self),
            let envelope = try wormhole.envelope(withIdentifier: "button")
        else { throw Output.fail("the mailbox \"button\" is empty") }
        Output.line("\"button\" holds tap \(tap.number), passed by \(envelope.sender) (message #\(envelope.sequence))")
        if let reply = try wormhole.message(withIdentifier: "widget-reply", as: WidgetReply.self) {
            Output.line("\"widget-reply\" holds \"\(reply.text)\"")
        }
        Output.line("mailboxes: \(try wormhole.identifiers().joined(separator: ", "))")
    }
}
