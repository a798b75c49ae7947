package tcpproxy

// StartDialed is New with a hook run each time the target is dialed,
// before the connection is registered: a test holds the accept loop there.
var StartDialed = start
