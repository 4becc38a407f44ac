import Foundation
import Logging
import PostgresNIO
import Testing
import WormholeCLI
import WormholeKit
import WormholeTesting

@testable import WormholePostgres

/// The engines every contract suite runs against. An engine added to the package adds a case here, and a branch to
/// ``EngineFixture/wormhole(_:)``: every contract test then runs against it too.
enum EngineKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    /// ``DirectoryEngine``: each wormhole gets an engine of its own on one directory, as separate processes do.
    case directory
    /// `InMemoryEngine`: every wormhole shares one engine, as processes share a directory.
    case inMemory
    /// `PostgresEngine`: each wormhole gets an engine of its own (connections, listening thread) on one group of the
    /// test run's PostgreSQL server, as processes on several hosts do.
    case postgres
    /// `PostgresEngine(client:)`: as `postgres`, each wormhole's engine borrowing its connections from a
    /// `PostgresClient` of its own, as an app that runs one does.
    case postgresClient

    var testDescription: String {
        switch self {
        case .directory: "directory engine"
        case .inMemory: "in-memory engine"
        case .postgres: "PostgreSQL engine"
        case .postgresClient: "PostgreSQL engine on a PostgresClient"
        }
    }
}

/// The PostgreSQL server of this test run, started at first use in a temporary directory and stopped, by its process
/// id, when the test process exits.
let testServer: Result<LocalPostgresServer, any Error> = {
    if QuickRun.isOn {
        return .failure(TestServerUnavailable(description: "a quick run (WORMHOLE_TEST_QUICK=1) starts no server"))
    }
    if let reason = LocalPostgresServer.unavailableReason() {
        return .failure(TestServerUnavailable(description: reason))
    }
    do {
        let started = ContinuousClock.now
        let server = try LocalPostgresServer()
        print("The test run's PostgreSQL server started in \(ContinuousClock.now - started), at \(server.url)")
        atexit { if case .success(let server) = testServer { server.close() } }
        return .success(server)
    } catch {
        return .failure(error)
    }
}()

/// Why the tests that need PostgreSQL cannot run here.
struct TestServerUnavailable: Error, CustomStringConvertible {
    let description: String
}

/// The test run's server, or the test is cancelled (reported as skipped, with the reason) when this machine cannot
/// run one. CI installs PostgreSQL, so there it always runs.
func requireTestServer() throws -> LocalPostgresServer {
    switch testServer {
    case .success(let server): return server
    case .failure(let error as TestServerUnavailable):
        try Test.cancel("PostgreSQL is not available on this machine: \(error)")
    case .failure(let error): throw error
    }
}

/// The URL of the server the contract suites use: `WORMHOLE_TEST_POSTGRES_URL` when set (a server of yours; each
/// test uses a group of its own), else the test run's own server.
func requireTestServerURL() throws -> String {
    if let url = ProcessInfo.processInfo.environment["WORMHOLE_TEST_POSTGRES_URL"], !url.isEmpty { return url }
    return try requireTestServer().url
}

/// A group name no other test uses.
func uniqueGroup(_ prefix: String = "test") -> String {
    "\(prefix).\(UInt64.random(in: 0...UInt64.max))"
}

/// One test's engine: hands out wormholes that behave as separate processes sharing one place, and a scratch
/// directory for files to send and to receive into. Everything is removed when the fixture goes away.
final class EngineFixture: Sendable {
    let kind: EngineKind
    /// Holds the wormhole's directory (for the directory engine) and the scratch directory.
    let temporary = TemporaryDirectory()
    /// The directory every directory engine of this fixture opens.
    let directory: String
    /// A directory for files to send, and destinations to receive into.
    let scratch: String
    /// The engine every in-memory wormhole of this fixture shares.
    private let inMemory: InMemoryEngine?
    /// The group every PostgreSQL wormhole of this fixture opens, and the engines made, closed at the end.
    let group = uniqueGroup()
    private let postgresEngines = Locked<[PostgresEngine]>([])
    private let clients = Locked<[RunningClient]>([])
    private let serverURL: String?

    init(_ kind: EngineKind) throws {
        self.kind = kind
        directory = temporary("wormhole")
        scratch = temporary("scratch")
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        inMemory = kind == .inMemory ? InMemoryEngine() : nil
        serverURL = kind == .postgres || kind == .postgresClient ? try requireTestServerURL() : nil
    }

    deinit {
        for engine in postgresEngines.withLock({ $0 }) { engine.close() }
        for client in clients.withLock({ $0 }) { client.stop() }
    }

    /// A new engine on the fixture's group, standing for a process of its own: with connections of its own, or
    /// borrowing them from a client of its own.
    func postgresEngine() throws -> PostgresEngine {
        let engine = try makeTestEngine(url: serverURL!, group: group, borrowing: kind == .postgresClient, clients)
        postgresEngines.withLock { $0.append(engine) }
        return engine
    }

    /// A wormhole sending as `sender`, standing for a process of its own.
    ///
    /// Directory engine: a new ``DirectoryEngine`` on the fixture's directory at each call (its own notifier, file
    /// handles and live connections). In-memory engine: the fixture's one engine. PostgreSQL engine: a new engine on
    /// the fixture's group at each call.
    func wormhole(_ sender: String) throws -> Wormhole {
        switch kind {
        case .directory: Wormhole(engine: try DirectoryEngine(directory: directory), sender: sender)
        case .inMemory: Wormhole(engine: inMemory!, sender: sender)
        case .postgres, .postgresClient: Wormhole(engine: try postgresEngine(), sender: sender)
        }
    }

    /// A path inside the scratch directory.
    func scratch(_ name: String) -> String { scratch + "/" + name }
}

/// A new engine on `group` at `url`, standing for a process of its own: with connections of its own, or borrowing
/// them from a new client, kept in `clients` to be stopped at the end.
func makeTestEngine(
    url: String,
    group: String,
    borrowing: Bool,
    _ clients: Locked<[RunningClient]>
) throws -> PostgresEngine {
    guard borrowing else { return try PostgresEngine(url: url, group: group) }
    let client = try RunningClient(url: url)
    clients.withLock { $0.append(client) }
    return try client.engine(group: group)
}

/// A postgres-nio client on a server, running in a task of its own until ``stop()``, as an app runs one.
final class RunningClient: Sendable {
    let client: PostgresClient
    private let running: Task<Void, Never>

    init(url: String) throws {
        let configuration = try PostgresLocation(url: url).plainClientConfiguration()
        let client = PostgresClient(configuration: configuration, backgroundLogger: Logger(label: "test.client"))
        self.client = client
        // As the engine's documentation says to: the contract tests call the engine's synchronous API from tasks of
        // the cooperative pool, and a client that needs one of its threads to open a connection would wait.
        running = Task(executorPreference: PostgresClientExecutor.shared) { await client.run() }
    }

    /// An engine on the client, made on this thread through the same steps as `PostgresEngine(client:group:)`
    /// (whose only difference is a hop off the cooperative pool), for the contract suites' synchronous fixtures.
    func engine(group: String) throws(WormholeError) -> PostgresEngine {
        let logger = Logger(label: "wormhole.postgres")
        let connections = Connections(source: .client(client), timeout: .seconds(30), logger: logger)
        try PostgresEngine.open(group, connections, setsUpSchema: true)
        return PostgresEngine(connections: connections, group: group, logger: logger)
    }

    /// Stops the client: its pool closes its connections.
    func stop() { running.cancel() }
}

// MARK: - Helpers of the contract suites

/// The error the contract suites' handlers throw.
struct ContractFailure: Error, CustomStringConvertible {
    var description: String { "contract handler refused" }
}

/// Polls `condition` every 5 ms until it holds or `timeout` seconds pass, suspending instead of blocking a thread of
/// the cooperative pool (which async tests and the tasks they wait for share); returns whether it held.
func eventuallyAwaiting(timeout: Double = 10, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout * sanitizerSlowdown)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return try condition()
}

/// The result of `task` if it finishes within `timeout` seconds; else the task is cancelled and nil returned.
func result<Success: Sendable>(
    of task: Task<Success, any Error>,
    within timeout: Double = 10
) async -> Result<Success, any Error>? {
    await withTaskGroup(of: Result<Success, any Error>?.self) { group in
        group.addTask { await task.result }
        group.addTask {
            try? await Task.sleep(for: .milliseconds(Int(timeout * sanitizerSlowdown * 1000)))
            return nil
        }
        let first = await group.next() ?? nil
        if first == nil { task.cancel() }  // lets the child that awaits it end
        group.cancelAll()
        return first
    }
}

/// The error of a call expected to throw a ``WormholeError``; records an issue when it returns or throws another
/// error.
func wormholeError(
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> Void
) -> WormholeError? {
    do {
        try body()
        Issue.record("expected a WormholeError, the call returned", sourceLocation: sourceLocation)
    } catch let error as WormholeError {
        return error
    } catch {
        Issue.record("expected a WormholeError, got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

/// The error of an async call expected to throw a ``WormholeError``; as ``wormholeError(sourceLocation:_:)``.
func wormholeErrorAwaiting(
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async -> WormholeError? {
    do {
        try await body()
        Issue.record("expected a WormholeError, the call returned", sourceLocation: sourceLocation)
    } catch let error as WormholeError {
        return error
    } catch {
        Issue.record("expected a WormholeError, got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}
