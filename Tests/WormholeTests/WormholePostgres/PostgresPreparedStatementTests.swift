import Foundation
import Logging
import NIOCore
import PostgresNIO
import Testing
import WormholeCLI
import WormholeKit

@testable import WormholePostgres

/// The statements on the paths of messages are prepared once on each pooled connection
/// (`Connections.execute(_:_:doing:)`): what they return must decode as the same statements sent whole do, a
/// statement must not be prepared again on every call, and one the server can no longer run must not fail forever.
@Suite(
    "PostgreSQL engine: prepared statements",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 2)
)
struct PostgresPreparedStatementTests {
    /// The statements prepared on the connection that runs it, itself included.
    private static let preparedCount = PreparedStatement(sql: "SELECT count(*) FROM pg_catalog.pg_prepared_statements")

    private func preparedCount(_ connections: Connections) throws -> Int64 {
        try decode(Int64.self, connections.execute(Self.preparedCount, [], doing: "counting").first, doing: "counting")
    }

    private func connections() throws -> Connections {
        Connections(
            source: .location(try PostgresLocation(url: try requireTestServerURL())),
            timeout: .seconds(30),
            logger: Logger(label: "tests")
        )
    }

    @Test("Binary columns decode (bigint, integer, text, bytea, boolean) and a null bind reaches the server as NULL")
    func decodesBinaryColumns() async throws {
        try await offThePool {
            let connections = try connections()
            defer { connections.close() }
            let statement = PreparedStatement(
                sql: "SELECT $1::bigint, $2::integer, $3::text, $4::bytea, $5::bigint IS NULL"
            )
            for round in 0..<3 {
                let rows = try connections.execute(
                    statement,
                    [
                        PostgresData(int64: -5_000_000_000 - Int64(round)), PostgresData(int32: 42),
                        PostgresData(string: "héllo"),
                        PostgresData(type: .bytea, value: ByteBuffer(bytes: [0, 1, 255])), .null,
                    ],
                    doing: "testing"
                )
                var columns = try #require(rows.first).columns()
                let big = try columns.decode(Int64.self)
                let small = try columns.decode(Int32.self)
                let text = try columns.decode(String.self)
                let bytes = try columns.decode(ByteBuffer.self)
                let isNull = try columns.decode(Bool.self)
                #expect(big == -5_000_000_000 - Int64(round))
                #expect(small == 42)
                #expect(text == "héllo")
                #expect(Array(buffer: bytes) == [0, 1, 255])
                #expect(isNull)
            }
        }
    }

    @Test("A statement is prepared once per connection, not on every call")
    func preparedOnce() async throws {
        try await offThePool {
            let connections = try connections()
            defer { connections.close() }
            // One borrower at a time: every call takes the same pooled connection.
            let counts = try (0..<5).map { _ in try preparedCount(connections) }
            #expect(counts == [1, 1, 1, 1, 1], "the session holds one prepared statement, itself")
        }
    }

    @Test("A prepared statement the server refuses is serverRejected with its SQLSTATE, and keeps its connection")
    func refusedKeepsItsConnection() async throws {
        try await offThePool {
            let connections = try connections()
            defer { connections.close() }
            let backend = PreparedStatement(sql: "SELECT pg_catalog.pg_backend_pid()")
            let divide = PreparedStatement(sql: "SELECT 1 / $1::integer")
            let before = try decode(Int32.self, try connections.execute(backend, [], doing: "testing").first, doing: "")
            let error = #expect(throws: WormholeError.self) {
                try connections.execute(divide, [PostgresData(int32: 0)], doing: "dividing")
            }
            #expect(error?.code == .serverRejected)
            #expect(error?.message.contains("SQLSTATE 22012") == true, "\(String(describing: error))")
            let after = try decode(Int32.self, try connections.execute(backend, [], doing: "testing").first, doing: "")
            #expect(after == before, "the same session")
            let quotient = try connections.execute(divide, [PostgresData(int32: 1)], doing: "dividing").first
            #expect(try decode(Int32.self, quotient, doing: "dividing") == 1)
            // The refused statement stayed prepared for the next call, not prepared again beside itself.
            #expect(try preparedCount(connections) == 3, "the backend's, the division and the count")
        }
    }

    @Test("A statement whose result changed under it, or that its session lost, is prepared again and run at once")
    func preparedAgainWhenTheServerCannotRunIt() async throws {
        try await offThePool {
            let connections = try connections()
            defer { connections.close() }
            let table = "public.prepared_probe_\(UInt32.random(in: 0...UInt32.max))"
            let admin = try self.connections()
            defer {
                _ = try? admin.query(PostgresQuery(unsafeSQL: "DROP TABLE IF EXISTS \(table)"), doing: "cleaning up")
                admin.close()
            }
            try admin.query(PostgresQuery(unsafeSQL: "CREATE TABLE \(table) (a bigint)"), doing: "setting up")
            try admin.query(PostgresQuery(unsafeSQL: "INSERT INTO \(table) VALUES (7)"), doing: "setting up")
            let statement = PreparedStatement(sql: "SELECT * FROM \(table)")
            #expect(try connections.execute(statement, [], doing: "reading").first?.row.count == 1)

            // The server refuses the statement as prepared (0A000, "cached plan must not change result type").
            try admin.query(PostgresQuery(unsafeSQL: "ALTER TABLE \(table) ADD COLUMN b text"), doing: "altering")
            let rows = try connections.execute(statement, [], doing: "reading")
            #expect(rows.first?.row.count == 2, "prepared again, with the new column")
            #expect(try decode(Int64.self, rows.first, doing: "reading") == 7)
            #expect(try preparedCount(connections) == 2, "the old statement was closed")

            // The session forgets its statements (26000, "prepared statement does not exist"), as behind a pooler.
            _ = try connections.withConnection { (connection) throws(WormholeError) in
                try connections.run("DEALLOCATE ALL", on: connection, doing: "forgetting")
            }
            #expect(try connections.execute(statement, [], doing: "reading").first?.row.count == 2)
            #expect(try preparedCount(connections) == 2)
        }
    }
}
