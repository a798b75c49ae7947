package postboxamqp

// SkipFrameCheck makes p send header frames over the connection's
// frame_max, so a test can see the broker refuse one.
func SkipFrameCheck(p *Publisher) { p.noFrameCheck = true }

// DeliveryOf exposes the mapping of an AMQP delivery to a postbox one.
var DeliveryOf = delivery
