import SiwaStore
import Testing

@Suite("DATABASE_URL: what serve and doctor warn about", .timeLimit(.minutes(10)))
struct DatabaseURLTests {
    @Test("sslmode unset, prefer or allow to a host off this machine is warned (TLS can be stripped); require, disable, loopback and sockets are not")
    func downgradeWarning() {
        for url in [
            "postgres://siwa:pw@db.internal:5432/siwa", "postgres://siwa:pw@db.internal/siwa?sslmode=prefer",
            "postgresql://siwa:pw@10.0.0.5/siwa?sslmode=allow", "postgres://siwa:pw@127.0.0.1.example.com/siwa",
        ] {
            let warning = DatabaseURL.transportWarning(url)
            #expect(warning?.contains("sslmode=require") == true, "\(url)")
            #expect(warning?.contains("pw") == false, "\(url): the password stays out")
        }
        for url in [
            "postgres://siwa:pw@db.internal/siwa?sslmode=require", "postgres://siwa:pw@db.internal/siwa?sslmode=verify-full",
            "postgres://siwa:pw@db.internal/siwa?sslmode=disable", "postgres://siwa:pw@localhost/siwa", "postgres://siwa:pw@127.0.0.1:5432/siwa",
            "postgres://siwa:pw@[::1]:5432/siwa", "postgres://siwa@/siwa?host=/run/postgresql",
        ] {
            #expect(DatabaseURL.transportWarning(url) == nil, "\(url)")
        }
    }
}
