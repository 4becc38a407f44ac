import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit
import WormholePostgres

/// `wormhole demo hosts`: the app and its widget on two hosts, talking through PostgreSQL.
struct DemoHosts: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hosts",
        abstract: "Show the app and its widget on two hosts, talking through a PostgreSQL server.",
        discussion: """
            Where this machine allows it (root, `ip netns`, PostgreSQL installed), the demo makes two network \
            namespaces as the two hosts, each joined by a link of its own to a PostgreSQL server the demo starts, and \
            removes them all at the end. Elsewhere it says why, and uses the server given by --postgres (or \
            $WORMHOLE_POSTGRES_URL), with both processes on this host.
            """
    )

    @Option(help: "How many taps the app passes.")
    var taps = 5

    @Option(help: "The group to use.")
    var group = DemoDefaults.group

    @Option(
        help: ArgumentHelp(
            "A PostgreSQL server to use instead of one of the demo's own: postgres://USER:PASSWORD@HOST/DATABASE.",
            valueName: "url"
        )
    )
    var postgres: String?

    func validate() throws {
        if taps < 1 || taps > 10_000 { throw ValidationError("--taps must be between 1 and 10000.") }
    }

    func run() throws {
        let given =
            postgres
            ?? ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"].flatMap {
                $0.isEmpty ? nil : $0
            }
        let location = ["--group", group]
        let hostsUnavailable = NetworkHosts.unavailableReason()
        let serverUnavailable = LocalPostgresServer.unavailableReason()
        if given == nil, hostsUnavailable == nil, serverUnavailable == nil {
            Output.line("Wormhole demo across hosts: an app and its widget on two hosts, through PostgreSQL.")
            let hosts = try NetworkHosts(count: 2)
            defer { hosts.close() }
            let server = try LocalPostgresServer(listenAddresses: ["127.0.0.1"] + hosts.serverAddresses)
            defer { server.close() }
            Output.line(
                "Hosts: \"widget\" at \(hosts.hostAddress(0)) and \"app\" at \(hosts.hostAddress(1)), network "
                    + "namespaces \(hosts.namespace(0)) and \(hosts.namespace(1))."
            )
            Output.line(
                "PostgreSQL \(server.processIdentifier): the widget reaches it at \(hosts.serverAddress(0)), the app "
                    + "at \(hosts.serverAddress(1)); neither host can reach the other but through it."
            )
            try prepare(url: server.url)
            Output.line("")
            func placement(_ index: Int) -> Demo.Placement { Demo.Placement(host: index, of: hosts, server: server) }
            try Demo.runProcesses(
                taps: taps,
                location: location,
                widgetPlacement: placement(0),
                appPlacement: placement(1),
                readerPlacement: placement(0)
            )
            Output.line("")
            Output.line("The hosts, their links and the server are removed now.")
            return
        }
        guard let given else {
            throw Output.fail(
                "This machine cannot make two hosts and a server of the demo's own ("
                    + [hostsUnavailable, serverUnavailable].compactMap { $0 }.joined(separator: "; ")
                    + "). Give a PostgreSQL server with --postgres URL or WORMHOLE_POSTGRES_URL."
            )
        }
        if let reason = hostsUnavailable ?? serverUnavailable {
            Output.line("No hosts of the demo's own here (\(reason)); using the server given.")
        }
        Output.line("Wormhole demo across hosts: an app and its widget, both on this host, through PostgreSQL.")
        try prepare(url: given)
        Output.line("")
        let environment = ["WORMHOLE_POSTGRES_URL": given]
        try Demo.runProcesses(
            taps: taps,
            location: location,
            widgetPlacement: Demo.Placement(environment: environment),
            appPlacement: Demo.Placement(environment: environment),
            readerPlacement: Demo.Placement(environment: environment)
        )
    }

    /// Opens the group (setting up the schema) and empties its mailboxes, as the directory demo does.
    private func prepare(url: String) throws {
        let engine = try PostgresEngine(url: url, group: group)
        defer { engine.close() }
        Output.line("Server: \(try PostgresLocation(url: url)), group \(group).")
        try Wormhole(engine: engine).clearAllMessageContents()
    }
}
